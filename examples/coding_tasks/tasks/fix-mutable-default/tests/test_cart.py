import sys

sys.path.insert(0, ".")
from cart import add_item

assert add_item("apple") == ["apple"]
assert add_item("pear") == ["pear"], "a new cart must start empty"
mine = add_item("a", [])
assert add_item("b", mine) == ["a", "b"] and mine == ["a", "b"]
print("ok")
