"""`lf tokenize fit|encode|decode|report`: action tokenizers (lf-tokenize-action) on the command line.

The lead registers it in cli.py with ``app.add_typer(tokenize_app, name="tokenize")``.
Datasets are LeRobot v3.0 folders: the ``action`` column of ``data/*/*.parquet``
(read with pyarrow) and the ``action`` entry of ``meta/stats.json``. Action chunks
are windows of ``horizon`` consecutive frames inside one episode, every
``stride`` frames. FAST token files are int64 ``.npy`` arrays ``(n, L)`` padded
with -1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.table import Table

from lf_orchestrator._console import fail, make_console

tokenize_app = typer.Typer(help="Fit, apply and compare action tokenizers (binning, FAST).", no_args_is_help=True)
console = make_console(stderr=True)
PAD = -1


def _fail(message: str) -> None:
    fail(console, message)


def read_actions(dataset: Path) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Per-episode action arrays ``(T_e, D)`` float64 (episode order) and the ``action`` stats of a LeRobot folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(dataset.glob("data/*/*.parquet"))
    stats_file = dataset / "meta" / "stats.json"
    if not files or not stats_file.is_file():
        _fail(f"{dataset} is not a LeRobot v3.0 dataset: need data/*/*.parquet and meta/stats.json")
    table = pa.concat_tables([pq.read_table(f, columns=["action", "episode_index"]) for f in files])
    col = table.column("action").combine_chunks()
    actions = col.flatten().to_numpy(zero_copy_only=False).astype(np.float64).reshape(len(col), -1)
    episodes = table.column("episode_index").to_numpy()
    stats = json.loads(stats_file.read_text()).get("action")
    if stats is None:
        _fail(f"{stats_file} has no 'action' entry")
    return [actions[episodes == e] for e in np.unique(episodes)], stats


def make_chunks(episodes: list[np.ndarray], horizon: int, stride: int) -> np.ndarray:
    """Windows ``(n, horizon, D)`` of consecutive frames within each episode, starting every ``stride`` frames."""
    out = [ep[s : s + horizon] for ep in episodes for s in range(0, len(ep) - horizon + 1, stride)]
    if not out:
        _fail(f"no episode holds {horizon} frames; lower --horizon")
    return np.stack(out)


def _load(path: Path) -> Any:
    from lf_tokenize_action import BinningTokenizer, FastTokenizer

    try:
        fmt = json.loads(path.read_text(encoding="utf-8")).get("format")
        return FastTokenizer.load(path) if fmt == "lf-tokenize-action/fast" else BinningTokenizer.load(path)
    except FileNotFoundError:
        _fail(f"{path}: no such file")
    except (ValueError, AttributeError) as err:  # not UTF-8, not JSON, not an object, or not a tokenizer
        _fail(f"{path}: not a tokenizer JSON written by `lf tokenize fit` ({type(err).__name__}: {err})")


def _load_npy(path: Path) -> np.ndarray:
    """A numeric ``.npy`` array; never unpickled (``allow_pickle=False``): an object array or a pickle is refused,
    naming the file and the first class its pickle names."""
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        _fail(f"{path}: no such file")
    except ValueError as err:
        if "pickle" not in str(err):
            _fail(f"{path}: not a .npy array ({err})")
        from lf_parallel import pickle_globals

        data = path.read_bytes()
        if data[:6] == b"\x93NUMPY":  # header length: uint16 at 8 (version 1) or uint32 at 8 (versions 2, 3)
            start = 10 + int.from_bytes(data[8:10], "little") if data[6] == 1 else \
                12 + int.from_bytes(data[8:12], "little")
            data = data[start:]
        names = [n for n in pickle_globals(data) if not n.startswith("numpy.")]
        named = f"refused to unpickle {names[0]}" if names else "refused to unpickle an object array"
        _fail(f"{path}: {named}; lf reads numeric .npy arrays only and never unpickles one")


@tokenize_app.command()
def fit(
    dataset: Annotated[Path, typer.Argument(help="LeRobot v3.0 dataset folder.")],
    out: Annotated[Path, typer.Option("--out", help="Tokenizer JSON to write.")],
    kind: Annotated[str, typer.Option(help="binning | fast")] = "binning",
    bounds: Annotated[str, typer.Option(help="q01_q99 | min_max | mean_std (from meta/stats.json)")] = "q01_q99",
    n_bins: Annotated[int, typer.Option(help="binning: bins per dimension")] = 256,
    binning: Annotated[str, typer.Option(help="binning: uniform | quantile")] = "uniform",
    horizon: Annotated[int, typer.Option(help="fast: chunk length H")] = 10,
    stride: Annotated[int, typer.Option(help="fast: frames between chunk starts")] = 1,
    scale: Annotated[float, typer.Option(help="fast: DCT scale")] = 10.0,
    vocab_size: Annotated[int, typer.Option(help="fast: BPE vocabulary size")] = 1024,
    max_reconstruction_error: Annotated[float | None, typer.Option(
        help="fast: fail when some dimension's max |decode(encode(x)) - x| on the chunks exceeds this "
             "(action units)")] = None,
) -> None:
    """Fit a binning or FAST tokenizer on a dataset's actions and write it as JSON.

    FAST also prints its reconstruction error on the fitting chunks per action dimension."""
    from lf_data import DataError, check_action_stats
    from lf_tokenize_action import BinningTokenizer, FastTokenizer

    episodes, stats = read_actions(dataset)
    try:
        check_action_stats(stats, "action", str(dataset / "meta" / "stats.json"), bounds, np.concatenate(episodes))
    except DataError as err:
        _fail(str(err))
    try:
        if kind == "binning":
            tok = BinningTokenizer.fit(stats, n_bins=n_bins, bounds=bounds, binning=binning,
                                       actions=np.concatenate(episodes) if binning == "quantile" else None)
        elif kind == "fast":
            tok = FastTokenizer.fit(make_chunks(episodes, horizon, stride), scale=scale, vocab_size=vocab_size,
                                    stats=stats, bounds=bounds, max_reconstruction_error=max_reconstruction_error)
        else:
            _fail(f"--kind must be 'binning' or 'fast'; got {kind!r}")
    except ValueError as err:
        _fail(str(err))
    tok.save(out)
    print(f"wrote {out}: {tok!r}")
    if getattr(tok, "reconstruction_error", None) is not None:
        err = tok.reconstruction_error
        print(f"reconstruction error on the {err.chunks} fitting chunks (action units), per dimension:")
        for d, (m, r) in enumerate(zip(err.max_abs, err.rms, strict=True)):
            print(f"  dim {d}: max abs {m:.4g}, RMS {r:.4g}")


@tokenize_app.command()
def encode(
    tokenizer: Annotated[Path, typer.Argument(help="Tokenizer JSON from `lf tokenize fit`.")],
    actions: Annotated[Path, typer.Argument(help="Input .npy: (..., D) for binning, (n, H, D) for FAST.")],
    out: Annotated[Path, typer.Argument(help="Output .npy: bins (..., D) or FAST tokens (n, L) padded with -1.")],
) -> None:
    """Encode actions from a .npy file into bins or FAST tokens."""
    tok = _load(tokenizer)
    x = _load_npy(actions)
    try:
        if hasattr(tok, "bpe"):
            tokens = tok.encode(x)
            width = max((len(t) for t in tokens), default=0)
            res = np.full((len(tokens), width), PAD, dtype=np.int64)
            for r, t in enumerate(tokens):
                res[r, : len(t)] = t
        else:
            res = tok.encode(x)
    except ValueError as err:
        _fail(str(err))
    np.save(out, res)
    print(f"wrote {out}: shape {res.shape}")


@tokenize_app.command()
def decode(
    tokenizer: Annotated[Path, typer.Argument(help="Tokenizer JSON from `lf tokenize fit`.")],
    tokens: Annotated[Path, typer.Argument(help="Input .npy written by `lf tokenize encode`.")],
    out: Annotated[Path, typer.Argument(help="Output .npy of actions (float64).")],
    horizon: Annotated[int, typer.Option(help="fast: chunk length (default: the fitted one)")] = 0,
    on_error: Annotated[str, typer.Option(help="fast: raise | mask (failed rows become NaN)")] = "raise",
) -> None:
    """Decode bins or FAST tokens from a .npy file back into actions."""
    from lf_tokenize_action import ActionDecodeError

    tok = _load(tokenizer)
    ids = _load_npy(tokens)
    try:
        if hasattr(tok, "bpe"):
            res = tok.decode(ids, horizon=horizon or None, on_error=on_error, pad_id=PAD)
            if on_error == "mask":
                res, failed = res
                console.print(f"{int(failed.sum())} of {len(failed)} rows failed to decode (NaN)")
        else:
            res = tok.decode(ids)
    except (ActionDecodeError, ValueError, TypeError) as err:
        _fail(str(err))
    np.save(out, res)
    print(f"wrote {out}: shape {res.shape}")


def report_rows(episodes: list[np.ndarray], stats: dict, *, horizon: int, scales: list[float],
                vocab_sizes: list[int], n_bins: int, bounds: str = "q01_q99") -> list[dict[str, Any]]:
    """Tokens per chunk and reconstruction error for binning and FAST on held-out episodes.

    Episodes ``e`` with ``e % 5 == 4`` are held out for evaluation (all episodes when
    fewer than 5); tokenizers are fitted on the rest, chunks use stride 1. Errors are
    mean absolute errors in normalized units (``[-1, 1]`` scale of the bounds) and in
    action units; ``clipped`` is the fraction of held-out chunks with a clipped value.
    FAST rows also carry ``fit_max_abs`` and ``fit_rms``: lists of D floats, the
    tokenizer's own reconstruction error on its fitting chunks per action dimension
    (action units, ``FastTokenizer.reconstruction_error``). A FAST configuration that cannot be
    fitted (``FastTokenizer.fit`` raises a ``ValueError`` such as ``CoefficientRangeError``) keeps
    its row with ``None`` for every number and ``error``: the exception's class name and message.
    """
    from lf_tokenize_action import BinningTokenizer, FastTokenizer

    held = [e for i, e in enumerate(episodes) if i % 5 == 4] if len(episodes) >= 5 else episodes
    train = [e for i, e in enumerate(episodes) if i % 5 != 4] if len(episodes) >= 5 else episodes
    train_chunks, test = make_chunks(train, horizon, 1), make_chunks(held, horizon, 1)
    rows = []

    def add(name: str, tok: Any, out: np.ndarray, n_tokens: float, clipped: np.ndarray) -> None:
        span = np.where(tok.high > tok.low, (tok.high - tok.low) / 2, 1.0)
        rows.append({"tokenizer": name, "tokens_per_chunk": float(n_tokens),
                     "mae_normalized": float(np.mean(np.abs(out - test) / span)),
                     "mae_action": float(np.mean(np.abs(out - test))), "clipped": float(np.mean(clipped))})

    for binning in ("uniform", "quantile"):
        tok = BinningTokenizer.fit(stats, n_bins=n_bins, bounds=bounds, binning=binning,
                                   actions=np.concatenate(train) if binning == "quantile" else None)
        bins, clipped = tok.encode(test, return_clipped=True)
        add(f"binning {binning} n_bins={n_bins}", tok, tok.decode(bins), horizon * test.shape[-1],
            clipped.any(axis=(1, 2)))
    for scale in scales:
        for vocab in vocab_sizes:
            name = f"FAST scale={scale:g} vocab={vocab}"
            try:
                tok = FastTokenizer.fit(train_chunks, scale=scale, vocab_size=vocab, stats=stats, bounds=bounds)
            except ValueError as err:  # e.g. CoefficientRangeError, or an alphabet larger than the vocabulary
                rows.append({"tokenizer": name, "tokens_per_chunk": None, "mae_normalized": None,
                             "mae_action": None, "clipped": None, "error": f"{type(err).__name__}: {err}"})
                continue
            tokens, clipped = tok.encode(test, return_clipped=True)
            add(name, tok, tok.decode(tokens, horizon=horizon),
                np.mean([len(t) for t in tokens]), clipped)
            rows[-1].update(fit_max_abs=tok.reconstruction_error.max_abs.tolist(),
                            fit_rms=tok.reconstruction_error.rms.tolist())
    return rows


@tokenize_app.command()
def report(
    dataset: Annotated[Path, typer.Argument(help="LeRobot v3.0 dataset folder.")],
    horizon: Annotated[int, typer.Option(help="chunk length H")] = 10,
    scales: Annotated[str, typer.Option(help="FAST scales, comma-separated")] = "10,50,200",
    vocab_sizes: Annotated[str, typer.Option(help="FAST vocabulary sizes, comma-separated")] = "256,1024,4096",
    n_bins: Annotated[int, typer.Option(help="binning: bins per dimension")] = 256,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Compare tokenizers: tokens per chunk and reconstruction error (normalized and in action units)."""
    episodes, stats = read_actions(dataset)
    try:
        rows = report_rows(episodes, stats, horizon=horizon, scales=[float(s) for s in scales.split(",")],
                           vocab_sizes=[int(v) for v in vocab_sizes.split(",")], n_bins=n_bins)
    except ValueError as err:
        _fail(str(err))
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{dataset.name}: {len(episodes)} episodes, horizon {horizon}, D {episodes[0].shape[1]}")
    for col in ("tokenizer", "tokens/chunk", "MAE normalized", "MAE action units", "clipped chunks"):
        table.add_column(col, justify="left" if col == "tokenizer" else "right")
    failed = [r for r in rows if "error" in r]
    for r in rows:
        if "error" in r:
            table.add_row(r["tokenizer"], *["not fitted"] + ["-"] * 3)
        else:
            table.add_row(r["tokenizer"], f"{r['tokens_per_chunk']:.1f}", f"{r['mae_normalized']:.4f}",
                          f"{r['mae_action']:.4f}", f"{r['clipped']:.1%}")
    out = make_console(width=120)
    out.print(table)
    for r in failed:
        out.print(f"{r['tokenizer']}: not fitted: {r['error']}", highlight=False, markup=False, soft_wrap=True)
    fast = [r for r in rows if "fit_max_abs" in r]
    if fast:
        per_dim = Table(title="FAST fit error per action dimension: max abs / RMS (action units)")
        per_dim.add_column("tokenizer")
        for d in range(len(fast[0]["fit_max_abs"])):
            per_dim.add_column(f"dim {d}", justify="right")
        for r in fast:
            per_dim.add_row(r["tokenizer"], *(f"{m:.3g} / {s:.3g}" for m, s in zip(r["fit_max_abs"], r["fit_rms"],
                                                                                      strict=True)))
        out.print(per_dim)
