import sys

from placer.examples import DATA, generate

for name, paths in generate(sys.argv[1] if len(sys.argv) > 1 else DATA).items():
    print(name, *(str(p) for p in paths.values()))
