# Convenience targets; each is a plain command you can also run by hand inside the virtual environment.
.PHONY: test lint bench

test:
	python -m pytest

lint:
	mypy
	ruff check src tests benchmarks setup.py build_backend
	ruff format --check src tests benchmarks setup.py build_backend

bench:
	python benchmarks/bench_philly.py --policy fifo --policy sjf --policy srtf
	python benchmarks/bench_antman.py
	python benchmarks/bench_fragmentation.py
	python benchmarks/bench_scaling.py
	python benchmarks/bench_round.py
