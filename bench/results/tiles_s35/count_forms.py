"""Issue 35, session 35: intervals and means inside the bound to 0.95x, for each fidelity table of a part's read/.

    python bench/results/tiles_s35/count_forms.py PART_DIR/read [table names ...]

Reads the `table_<form>.md` files `read_part.sh` (and the what-ifs beside it) write; prints one line a form:
intervals inside / 15, means inside / 15, TPOT P50 means and same chunks by load.
"""
import pathlib
import sys

BOUNDS = (5, 10, 5, 10, 2)  # TTFT P50, P99, TPOT P50, P99, throughput (%)
LOADS = ("0.5x", "0.8x", "0.95x")


def count(md: pathlib.Path) -> tuple[int, int, int, list[str], list[str]]:
    inside = means = total = 0
    tpot, chunks = [], []
    for line in md.read_text().splitlines():
        c = [x.strip() for x in line.split("|")[1:-1]]
        if len(c) < 13 or c[5] not in LOADS:
            continue
        for cell, b in zip(c[6:11], BOUNDS):
            total += 1
            inside += cell.startswith("**")
            means += abs(float(cell.strip("*").split("±")[0])) <= b
        tpot.append(c[8].strip("*").split("±")[0].strip())
        chunks.append(c[12].split("%")[0])
    return inside, means, total, tpot, chunks


def main() -> None:
    read = pathlib.Path(sys.argv[1])
    names = sys.argv[2:] or sorted(p.stem[len("table_"):] for p in read.glob("table_*.md"))
    print(f"{'form':22s} intervals  means  TPOT P50 0.5/0.8/0.95x   same chunks %")
    for n in names:
        i, m, t, tp, ch = count(read / f"table_{n}.md")
        print(f"{n:22s} {i:2d}/{t:<2d}      {m:2d}/{t:<2d}  {' / '.join(tp):22s}  {' / '.join(ch)}")


if __name__ == "__main__":
    main()
