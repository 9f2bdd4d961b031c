#!/bin/sh
# Counts the draft-vocabulary frequency table shipped in crates/augur/data/draft_vocab/qwen2.bin (see the README
# there): the most frequent Qwen2 tokenizer ids over CPython's standard library and its release notes as Debian
# installs them (PSF licence): the library's source with its comments and docstrings (tests and IDLE left
# out), and NEWS and HISTORY, English prose.
#
#   tools/draft_vocab/build.sh [MODEL.gguf] [PYTHON]
#
# MODEL.gguf: any GGUF with the Qwen2.5 tokenizer (default: the catalogue's qwen2.5-coder-0.5b-instruct in
# augur's model cache); PYTHON: the interpreter's name under /usr/lib and /usr/share/doc (default python3.11).
set -eu
cd "$(dirname "$0")/../.."
model=${1:-$HOME/.cache/augur/models/qwen2.5-coder-0.5b-instruct.gguf}
python=${2:-python3.11}
docs=$(mktemp -d)
trap 'rm -rf "$docs"' EXIT
for f in NEWS HISTORY; do
    zcat "/usr/share/doc/$python/$f.gz" > "$docs/$f"
done
{
    find "/usr/lib/$python" -name '*.py' -not -path '*/test/*' -not -path '*/tests/*' -not -path '*/idlelib/*' \
        -not -path '*/site-packages/*' -not -path '*/dist-packages/*' | LC_ALL=C sort
    echo "$docs/NEWS"
    echo "$docs/HISTORY"
} | cargo run --release -p augur --example draft_vocab_table -- "$model" crates/augur/data/draft_vocab/qwen2.bin 65536
