from pathlib import Path

want = sum("ERROR" in line for f in Path("logs").glob("*.log") for line in f.read_text().splitlines())
got = Path("errors.txt").read_text().strip()
assert got == str(want), (got, want)
print("ok")
