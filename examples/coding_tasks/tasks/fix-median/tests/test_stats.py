import sys

sys.path.insert(0, ".")
from stats import mean, median

assert median([3, 1, 2]) == 2
assert median([4, 1, 3, 2]) == 2.5, median([4, 1, 3, 2])
assert median([10, 0]) == 5
assert median([7]) == 7
assert mean([1, 2, 3]) == 2
print("ok")
