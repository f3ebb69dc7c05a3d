"""Math RL against SGLang servers (or the embedded CPU engine): data, reward, one command."""
