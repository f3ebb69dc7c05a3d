import json
from pathlib import Path

config = json.loads(Path("config.json").read_text())
assert config == {"name": "service", "port": 8080, "debug": False, "workers": 4}, config
print("ok")
