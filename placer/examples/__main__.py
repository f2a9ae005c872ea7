import sys

from placer.examples import DATA, generate, gpt2

if len(sys.argv) > 1 and sys.argv[1] in gpt2.PRESETS:   # one GPT-2 preset: PRESET [FOLDER]
    for p in gpt2.write(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ".").values():
        print(p)
else:
    for name, paths in generate(sys.argv[1] if len(sys.argv) > 1 else DATA).items():
        print(name, *(str(p) for p in paths.values()))
