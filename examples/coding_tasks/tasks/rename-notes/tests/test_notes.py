from pathlib import Path

names = sorted(p.name for p in Path("notes").iterdir())
assert names == ["monday.md", "team meeting.md", "todo.org", "tuesday.md"], names
for stem in ("monday", "tuesday", "team meeting"):
    assert Path(f"notes/{stem}.md").read_text() == f"notes of {stem}\n"
assert Path("notes/todo.org").read_text() == "keep\n"
print("ok")
