total = 0.0
with open("sales.csv") as f:
    header = f.readline().strip().split(",")
    column = header.index("amount")
    for line in f:
        fields = line.strip().split(",")
        try:
            total += float(fields[column])
        except ValueError:
            pass
print(f"{total:.2f}")
