"""The unclosed-quote scan of launch scripts (projection.formats.shell_quotes) against bash's quoting: scripts
`bash -n` accepts are not refused, and an unclosed quote is found at the line that opens it."""

from __future__ import annotations

import pytest

from projection.formats.shell_quotes import unclosed_quote


@pytest.mark.parametrize("script", [
    'X="$(echo "don\'t")"',                         # quotes nested in a command substitution inside "..."
    'PRIMUS_PATH=$(realpath "$(dirname "$0")/..")',  # the launchers' own idiom
    "X=$'it\\'s'",                                   # ANSI-C quoting escapes its quote
    "echo a |# it's a comment",                      # a comment after |
    "echo 'it''s'", 'echo "a \\" b"', "echo don\\'t", "a='x\ny'",
    "cat <<EOF\ndon't\nEOF\necho ok",                # a here-document's body is not quoted text
    "y=$((1<<2))", "X=`date`; Y='ok'",
    "cat <<\\EOF\nit's\nEOF\n", "cat << \\EOF\nit's\nEOF\n", "cat <<1EOF\nit's\n1EOF\n",  # other delimiters
    "echo \\$'a\\'\necho 'b'\n",                  # an escaped $ opens no $'...'
])
def test_scripts_bash_accepts(script: str) -> None:
    assert unclosed_quote(script) is None


@pytest.mark.parametrize(("script", "where"), [
    ('x=1\ntorchrun pretrain_gpt.py --num-layers "12\n', (2, '"')),
    ("cat <<-'END'\n\tit's\n\tEND\nx='a", (4, "'")),  # after a here-document
    ("y=$((1<<2))\nx='a", (2, "'")),                  # << in arithmetic is no here-document
    ('cat <<< "hi"\nx=\'a', (2, "'")),                 # nor is a here-string
    ("X=$(echo ok", (1, "$(")),
])
def test_unclosed_quotes(script: str, where: tuple[int, str]) -> None:
    assert unclosed_quote(script) == where
