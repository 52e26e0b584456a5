"""The voice family: transcription and its selector-less scheduling, speech, voices, Kobold
audio and the realtime path's plain GET."""
