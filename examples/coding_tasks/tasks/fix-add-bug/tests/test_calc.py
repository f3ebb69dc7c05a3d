import sys

sys.path.insert(0, ".")
from calc import add

assert add(2, 3) == 5, add(2, 3)
assert add(-1, 1) == 0
print("ok")
