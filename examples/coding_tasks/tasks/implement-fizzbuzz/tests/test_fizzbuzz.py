import sys

sys.path.insert(0, ".")
from fizzbuzz import fizzbuzz

expected = {1: "1", 3: "Fizz", 5: "Buzz", 15: "FizzBuzz", 22: "22", 30: "FizzBuzz", 9: "Fizz"}
for n, want in expected.items():
    assert fizzbuzz(n) == want, (n, fizzbuzz(n))
print("ok")
