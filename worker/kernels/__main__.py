"""`python -m worker.kernels`: build the native kernels (what `make kernels` runs)."""

from worker.kernels import build

if __name__ == "__main__":
    print(f"built {build()}")
