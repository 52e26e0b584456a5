"""The media family: OpenAI images, sdapi, sd.cpp jobs and ComfyUI."""
