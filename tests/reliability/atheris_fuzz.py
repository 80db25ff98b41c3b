"""Coverage-guided fuzzing (atheris, i.e. libFuzzer) of the record codec and the pipeline loader.

Not a test and not in CI: a few minutes of it now and then finds inputs that the hypothesis strategies do
not think of. ``pip install atheris`` first (wheels exist for CPython 3.8-3.11 on Linux x86_64)::

    python tests/reliability/atheris_fuzz.py codec  --seconds 300
    python tests/reliability/atheris_fuzz.py config --seconds 300

The properties checked on every input:

* codec: ``decode`` raises nothing but CodecError; what it decodes, ``encode`` encodes or refuses with a
  CodecError; and for every input msgspec decodes, the non-recursive depth scan equals the depth of the
  decoded value (a differential check of sluice/codecs/depth.py);
* config: ``parse_pipeline`` returns or raises ConfigError -- nothing else -- within a second, with at
  most 21 short lines.

A crashing input is written to ``fuzz_regressions/<target>/crash-<sha1>``; commit it, and
``test_fuzz.py::test_atheris_findings_stay_fixed`` replays it from then on (through ``check_codec`` /
``check_config`` below, which need no atheris).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REGRESSIONS = HERE / "fuzz_regressions"
SEEDS = {
    "codec": [b'\x00{"text": "a", "x": [[1, {"b": "[\\"]"}]]}', b'\x03\\u00e9\\\\', b"\x02" + b"[" * 40,
              b"\x011e400", b'\x02[{"a": "]"}, "\\\\"]'],
    "config": [(HERE.parents[1] / "examples" / "pipelines" / "shout.yaml").read_bytes(),
               b"x-k: &k {bootstrap_servers: h}\nsource: {kafka: {<<: *k, topics: [a], group_id: g}}\n",
               b"a: &a [*a]\n", b"name: !!timestamp 2001-13-45\n"],
}


# The codec's target wraps most inputs into a record, so that the fuzzer spends its time on valid JSON
# (the depth scan, the field lookup, encoding) rather than on bytes msgspec rejects at once.
_TEMPLATES = (b"%s", b'{"text": %s}', b'{"text": "a", "x": %s}', b'{"text": "%s"}')


def check_codec(data: bytes) -> None:
    import msgspec

    from sluice.codecs.depth import nesting_depth
    from sluice.codecs.record_codec import CodecError, RecordCodec
    from sluice.config import Codec, Output
    from tests.support.json_depth import depth_of

    if data:  # the first byte picks the template
        data = _TEMPLATES[data[0] % len(_TEMPLATES)] % data[1:]
    codec = RecordCodec(Codec(max_depth=32, max_record_bytes=1_000_000), Output())
    try:
        document, _ = codec.decode(data)
    except CodecError:
        pass
    else:
        try:
            codec.encode(document, "result")
        except CodecError:
            pass
    try:
        value = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return
    assert nesting_depth(data) == depth_of(value), (data[:200], nesting_depth(data), depth_of(value))


def check_config(data: bytes) -> None:
    from sluice.config import ConfigError, parse_pipeline

    text = data.decode("utf-8", "replace")
    started = time.perf_counter()
    try:
        parse_pipeline(text, environ={"SET": "1"})
    except ConfigError as err:
        lines = str(err).splitlines()
        assert 1 <= len(lines) <= 21 and max(len(line) for line in lines) < 700, str(err)[:2000]
    elapsed = time.perf_counter() - started
    assert elapsed < 1.0, f"{elapsed:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=["codec", "config"])
    parser.add_argument("--seconds", type=int, default=300, help="how long to fuzz")
    args = parser.parse_args()

    import atheris  # only here: the checks above run without it (test_fuzz.py replays findings)

    sys.path.insert(0, str(HERE.parents[1]))  # this checkout's sluice, not whichever one is installed

    with atheris.instrument_imports():  # sluice, and the Python parts of PyYAML and pydantic it imports
        import sluice.codecs.depth  # noqa: F401
        import sluice.codecs.record_codec  # noqa: F401
        import sluice.config  # noqa: F401
        import sluice.config.yaml_file  # noqa: F401
    check = check_codec if args.target == "codec" else check_config
    out = REGRESSIONS / args.target
    out.mkdir(parents=True, exist_ok=True)
    corpus = Path(tempfile.gettempdir()) / f"sluice-atheris-{args.target}"  # working corpus: not worth committing
    corpus.mkdir(exist_ok=True)
    for i, seed in enumerate(SEEDS[args.target]):
        (corpus / f"seed{i}").write_bytes(seed)
    libfuzzer = [sys.argv[0], str(corpus), f"-max_total_time={args.seconds}", f"-artifact_prefix={out}/",
                 "-timeout=10", "-rss_limit_mb=3072", "-max_len=65536", "-print_final_stats=1"]
    atheris.Setup(libfuzzer, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
