import subprocess

out = subprocess.run(["python3", "report.py"], capture_output=True, text=True, check=True).stdout.strip()
assert out == "20.00", out
print("ok")
