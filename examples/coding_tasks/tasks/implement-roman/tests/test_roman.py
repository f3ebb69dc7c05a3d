import sys

sys.path.insert(0, ".")
from roman import to_roman

expected = {1: "I", 4: "IV", 9: "IX", 14: "XIV", 40: "XL", 90: "XC", 400: "CD"}
expected |= {1994: "MCMXCIV", 2024: "MMXXIV", 3999: "MMMCMXCIX"}
for n, want in expected.items():
    assert to_roman(n) == want, (n, to_roman(n))
print("ok")
