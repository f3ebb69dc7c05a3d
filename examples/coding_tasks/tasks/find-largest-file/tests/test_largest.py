from pathlib import Path

assert Path("largest.txt").read_text().strip() == "data/raw/2024/march.bin", Path("largest.txt").read_text()
print("ok")
