"""The text family: OpenAI, Ollama and Kobold text paths, their translation, and the rest of
the text surface (responses, messages, rerank, embeddings, music)."""
