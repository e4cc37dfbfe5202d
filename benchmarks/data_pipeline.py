"""Data pipeline throughput per core, next to HF's WhisperFeatureExtractor, for short and 30-s clips.

    PYTHONPATH=. python benchmarks/data_pipeline.py [--data outputs/demo_data] [--quick]

Two input kinds, each timed single-threaded (torch, OpenMP and BLAS at one thread):
  short  demo-corpus clips (~2 s) for the tiny encoder: 80 mel bins, 5-s window (250 positions)
  30 s   whisper-large-v3 inputs: 20-30 s clips (demo clips joined with short pauses, written
         as a temporary MDS dataset), 128 mel bins, 30-s window (1500 positions), seq 2048
Rows: decoding the same clips encoded in memory as WAV, FLAC, MP3, OGG Vorbis and OGG Opus
(orchestrator.data.audio.load_audio; a format the installed libsndfile cannot write is
reported as such; FLAC also through libsndfile alone, the decoder before dr_flac), log-mel
(orchestrator.data.mel) against HF WhisperFeatureExtractor, with where its time goes (STFT,
power, mel filters, log and normalisation), prompt tokenization and packing, and
build_train_loader end to end with data.num_workers = 0, 1 and 2, and with
data.features_on=device (the log-mel left to the training step on the encoder's device)
at 0 and 2 workers (per core = wall-clock samples/s over main process + workers, capped at
the CPUs this process may use; also per CPU-second of main + workers, which other load on
a shared machine hardly changes; a loader that refuses workers is reported 'not
available'). Last, the CPU cores one GPU needs to feed TOKENS_PER_GPU tokens/s from those
rates, and for each GPU recipe's layout: every rank reading with the log-mel on the host
(before), one reader per model replica (data.replica_reader: its peers receive; the host
cost of pickling and unpickling a micro-batch is measured and added), and that with
data.features_on=device as the recipes set it.
The demo corpus (--data) is synthesized in a temp directory when it does not exist.
--quick: few clips and short loader runs (about a minute on 2 cores; the full run takes
about 3-4). Prints one table.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"  # per-core figures; inherited by loader worker processes

import argparse
import io
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
TOKENS_PER_GPU = 19_000  # decoder tokens/s one GPU trains (non-padding), for the cores-per-GPU rows
FORMATS = (("wav", "WAV", "PCM_16"), ("flac", "FLAC", "PCM_16"), ("mp3", "MP3", "MPEG_LAYER_III"),
           ("ogg vorbis", "OGG", "VORBIS"), ("ogg opus", "OGG", "OPUS"))
WORKERS = (0, 1, 2)
# End-to-end loader runs: (data.features_on, data.num_workers).
LOADER_RUNS = tuple(("cpu", w) for w in WORKERS) + (("device", 0), ("device", 2))


def _timed(fn, repeat: int = 1):
    best = float("inf")
    out = None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def _cpu_seconds() -> dict:
    """CPU seconds (user + system) of this process and each live child process, by pid."""
    import psutil

    me = psutil.Process()
    out = {}
    for proc in [me] + me.children(recursive=True):
        try:
            t = proc.cpu_times()
            out[proc.pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def _encode(clip: np.ndarray, fmt: str, subtype: str) -> bytes:
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.clip(clip, -1.0, 1.0), 16000, format=fmt, subtype=subtype)
    return buf.getvalue()


def _log_mel_stages(clips, bins: int, window: int, repeat: int) -> dict:
    """ms per clip of each step of orchestrator.data.mel's log-mel, one clip per call."""
    from orchestrator.data import mel

    waves = [mel.waveforms([c], window) for c in clips]
    hann = torch.hann_window(mel.N_FFT)
    filters = mel.mel_filters(bins)
    stages = {
        "STFT (400-point, hop 160)": lambda w: torch.stft(w, mel.N_FFT, mel.HOP_LENGTH, window=hann, center=True,
                                                         pad_mode="reflect", return_complex=True),
        "power": lambda s: mel.power_spectrum(torch.view_as_real(s)),
        "mel filters (matmul)": lambda p: torch.matmul(filters, p),
        "log10, floor, normalise": lambda m: mel.log_scale(m.clone()),
    }
    out, inputs = {}, waves
    for name, fn in stages.items():
        t, results = _timed(lambda: [fn(x) for x in inputs], repeat)
        out[name] = 1000 * t / len(clips)
        inputs = results
    return out


def _join_clips(clips, texts, count: int, seed: int = 0):
    """Demo clips joined with 0.2-0.6 s pauses into `count` clips of 20-30 s (and their transcripts)."""
    rng = np.random.default_rng(seed)
    out, out_texts, k = [], [], 0
    for _ in range(count):
        target, parts, words, total = rng.uniform(20.0, 28.0) * 16000, [], [], 0
        while total < target:
            clip, gap = clips[k % len(clips)], np.zeros(int(rng.uniform(0.2, 0.6) * 16000), np.float32)
            add = clip.shape[0] + (gap.shape[0] if parts else 0)
            if total + add > 30 * 16000:
                break
            parts += [gap, clip] if parts else [clip]
            words.append(texts[k % len(texts)])
            total += add
            k += 1
        out.append(np.concatenate(parts))
        out_texts.append(" ".join(words))
    return out, out_texts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.environ.get("AUDIOLLM_DEMO_DATA", "outputs/demo_data"))
    parser.add_argument("--quick", action="store_true", help="few clips and short loader runs (a fast check)")
    parser.add_argument("--clips", type=int, default=None, help="short clips per stage (default 256; quick 32)")
    parser.add_argument("--long-clips", type=int, default=None, help="20-30 s clips (default 32; quick 6)")
    parser.add_argument("--loader-seconds", type=float, default=None,
                        help="timed seconds per end-to-end loader run (default 8; quick 1.5)")
    parser.add_argument("--batches", type=int, default=None, help="micro-batches for the utilization figures")
    args = parser.parse_args(argv)
    n_short = args.clips or (32 if args.quick else 256)
    n_long = args.long_clips or (6 if args.quick else 32)
    loader_seconds = args.loader_seconds or (1.5 if args.quick else 8.0)
    util_batches = args.batches or (5 if args.quick else 30)
    repeat = 2 if args.quick else 3  # best of; the first call of each stage is an untimed warm-up
    torch.set_num_threads(1)  # per-core figures

    import miniaudio
    import soundfile as sf
    from omegaconf import OmegaConf
    from streaming import MDSWriter, StreamingDataset
    from transformers import WhisperFeatureExtractor

    from orchestrator.data import mel
    from orchestrator.data.audio import encode_flac, load_audio
    from orchestrator.data.loader import build_train_loader
    from orchestrator.data.packing import Example, Packer, collate
    from orchestrator.data.prompts import PromptBuilder, audio_placeholder_count
    from orchestrator.data.sources import single_rank_world
    from orchestrator.data.tokenizer_build import load_tokenizer
    from orchestrator.plan.schema.data import DataConfig, DatasetEntry
    from orchestrator.plan.schema.model import AdapterConfig, EncoderConfig

    tmp = tempfile.TemporaryDirectory(prefix="audiollm-bench-")
    root = Path(args.data)
    if not (root / "train").is_dir():
        from orchestrator.data.demo import write_corpus

        root = Path(tmp.name) / "demo"
        print(f"{args.data} has no demo corpus; synthesizing a small one in {root}", file=sys.stderr)
        write_corpus(root, num_samples=max(n_short, 14 * n_long, 200), num_val_samples=0, progress=False)
    train_dirs = sorted(p for p in (root / "train").iterdir() if (p / "index.json").is_file())
    tok = load_tokenizer(root / "tokenizer")
    builder = PromptBuilder(tok, DataConfig().prompt_template)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    # Demo clips for the short kind, and enough more to join into the 30-s clips.
    wanted = max(n_short, 14 * n_long)
    raw = []
    with single_rank_world():
        for d in train_dirs:
            ds = StreamingDataset(local=str(d), shuffle=False)
            raw += [ds[i] for i in range(min(len(ds), wanted // len(train_dirs) + 1))]
    demo_clips = [load_audio(s["audio"], None, 16000) for s in raw]
    demo_texts = [s["text"] for s in raw]
    long_clips, long_texts = _join_clips(demo_clips, demo_texts, n_long)
    long_dir = Path(tmp.name) / "long30s"
    with MDSWriter(out=str(long_dir), columns={"audio": "bytes", "text": "str"}, size_limit="64mb",
                   progress_bar=False) as writer:
        for clip, text in zip(long_clips, long_texts):
            writer.write({"audio": encode_flac(clip, 16000), "text": text})

    kinds = {
        "short": dict(clips=demo_clips[:n_short], texts=demo_texts[:n_short], bins=80, positions=250, seq=256,
                      mbs=16, max_seconds=5.0, dirs=train_dirs, decode_clips=64),
        "30 s": dict(clips=long_clips, texts=long_texts, bins=128, positions=1500, seq=2048, mbs=2,
                     max_seconds=30.0, dirs=[long_dir], decode_clips=8),
    }
    table = {}  # row label -> {kind: cell text}
    stats = {}  # kind -> figures for the summary rows

    def put(label, kind, text):
        table.setdefault(label, {})[kind] = text

    for kind, k in kinds.items():
        clips, n, bins, window = k["clips"], len(k["clips"]), k["bins"], 2 * k["positions"]
        st = stats[kind] = {"n": n, "seconds": float(np.mean([c.shape[0] for c in clips])) / 16000}

        # Decode: the same clips encoded in memory in each format (a subset: encoding Opus and MP3 is slow).
        few = clips[:k["decode_clips"]]
        for name, fmt, subtype in FORMATS:
            label = f"decode {name} -> float32 (load_audio)"
            try:
                encoded = [_encode(c, fmt, subtype) for c in few]
            except Exception as err:  # libsndfile without that encoder
                put(label, kind, "cannot write")
                print(f"{name}: soundfile cannot write {fmt}/{subtype}: {err}", file=sys.stderr)
                continue
            try:
                load_audio(encoded[0], None, 16000)
                t, _ = _timed(lambda: [load_audio(b, None, 16000) for b in encoded], repeat)
                put(label, kind, f"{len(few) / t:.1f}")
            except Exception as err:
                put(label, kind, "cannot read")
                print(f"{name}: load_audio failed: {err}", file=sys.stderr)

        flac = [_encode(c, "FLAC", "PCM_16") for c in few]
        t, _ = _timed(lambda: [sf.read(io.BytesIO(b), dtype="float32") for b in flac], repeat)
        put("decode flac -> float32, libsndfile alone (before)", kind, f"{len(few) / t:.1f}")

        # Log-mel, ours and HF's: one clip per call (what a loader worker does per sample) and 16 per call.
        hf = WhisperFeatureExtractor(feature_size=bins, chunk_length=window // 100)
        mel.features(clips[:2], bins, window), hf(clips[:2], sampling_rate=16000, return_tensors="np")  # warm-up
        t_ours1, _ = _timed(lambda: [mel.features([c], bins, window) for c in clips], repeat)
        t_ours, _ = _timed(lambda: [mel.features(clips[i:i + 16], bins, window) for i in range(0, n, 16)], repeat)
        t_hf1, _ = _timed(lambda: [hf(c, sampling_rate=16000, return_tensors="np") for c in clips], repeat)
        t_hf16, _ = _timed(lambda: [hf(clips[i:i + 16], sampling_rate=16000, return_tensors="np")
                                    for i in range(0, n, 16)], repeat)
        st["hf"] = n / min(t_hf1, t_hf16)
        put("log-mel (ours, mel.py, 1 clip per call)", kind, f"{n / t_ours1:.1f}")
        put("log-mel (ours, mel.py, 16 clips per call)", kind, f"{n / t_ours:.1f}")
        put("log-mel (HF WhisperFeatureExtractor, 1 clip per call)", kind, f"{n / t_hf1:.1f}")
        put("log-mel (HF WhisperFeatureExtractor, 16 clips per call)", kind, f"{n / t_hf16:.1f}")
        put("log-mel speed-up, faster ours / faster HF", kind, f"{min(t_hf1, t_hf16) / min(t_ours1, t_ours):.1f}x")
        ref = hf(clips[:8], sampling_rate=16000, return_tensors="np")["input_features"]
        put("log-mel max |ours - HF| (8 clips)", kind,
            f"{float(np.abs(mel.features(clips[:8], bins, window)[0].numpy() - ref).max()):.1e}")

        # Where the log-mel's time goes, one clip per call: ms per clip.
        for stage, ms in _log_mel_stages(clips, bins, window, repeat).items():
            put(f"  log-mel stage: {stage}, ms per clip", kind, f"{ms:.2f}")

        # Prompt tokenization and packing.
        t_tok, tokenized = _timed(lambda: [builder.build(text, [audio_placeholder_count(c.shape[0], k["positions"], 5)])
                                           for text, c in zip(k["texts"], clips)], repeat)
        put("prompt + tokenize (PromptBuilder)", kind, f"{n / t_tok:.1f}")

        def pack():
            packer = Packer(k["seq"], k["mbs"], 256)
            for i, t in enumerate(tokenized):
                packer.add(Example(i, 0, t, []))
            while packer.buffer:
                collate(packer.pop_rows(), k["seq"], 0, ["d"], builder.audio_token_id, num_rows=k["mbs"])
        t_pack, _ = _timed(pack, repeat)
        put("pack + collate (Packer; rows as in the header)", kind, f"{n / t_pack:.1f}")

        # End to end through the training loader.
        def data_cfg(packing=True, workers=0, features_on="cpu"):
            cfg = OmegaConf.structured(DataConfig)
            cfg.train = [OmegaConf.structured(DatasetEntry(name=d.name, path=str(d))) for d in k["dirs"]]
            cfg.tokenizer, cfg.seq_length, cfg.max_audio_seconds = str(root / "tokenizer"), k["seq"], k["max_seconds"]
            cfg.packing, cfg.num_workers, cfg.features_on = packing, workers, features_on
            return cfg
        enc = OmegaConf.structured(EncoderConfig(d_model=1, num_layers=1, num_heads=1, ffn_dim=1, num_mel_bins=bins,
                                                 max_source_positions=k["positions"]))
        ada = OmegaConf.structured(AdapterConfig(frame_stack=5))
        st["per_core"], st["per_cpu_s"] = {}, {}
        for features_on, workers in LOADER_RUNS:
            cores = min(1 + workers, cpus)
            run = f"num_workers={workers}" + (", features_on=device" if features_on == "device" else "")
            label = f"end to end, {run}: samples/s"
            core_label = f"  per core (wall / {cores} core{'s' * (cores > 1)}), {run}"
            cpu_label = f"  per CPU-second (CPU time of main + workers), {run}"
            ratio_label = f"  per core / HF feature extractor, {run}"
            try:
                loader = build_train_loader(data_cfg(workers=workers, features_on=features_on), enc, ada,
                                            micro_batch_size=k["mbs"], seed=0)
            except ValueError as err:
                if "num_workers" not in str(err):
                    raise
                for row in (label, core_label, cpu_label, ratio_label):
                    put(row, kind, "not available")
                continue
            try:
                next(loader)  # warm-up: fills the packing buffer (and starts workers)
                cpu0, start, samples, used, slots = _cpu_seconds(), time.perf_counter(), 0, 0, 0
                while time.perf_counter() - start < loader_seconds or samples < 2 * k["mbs"]:
                    b = next(loader)
                    samples, used = samples + b["num_samples"], used + b["num_tokens"]
                    slots += b["tokens"].numel()
                rate = samples / (time.perf_counter() - start)
                cpu = sum(t - cpu0.get(pid, 0.0) for pid, t in _cpu_seconds().items())
            finally:
                if hasattr(loader, "close"):
                    loader.close()
                del loader
            st["per_core"][features_on, workers] = rate / cores
            st["per_cpu_s"][features_on, workers] = samples / cpu
            if workers == 0:
                # What sending a micro-batch to the replica's peers costs the host (data.replica_reader):
                # the pickling on the reader and the unpickling on each peer, per sample.
                t_send, _ = _timed(lambda: pickle.loads(pickle.dumps(b)), repeat)
                st.setdefault("send_s_per_sample", {})[features_on] = t_send / b["num_samples"]
                if features_on == "cpu":
                    st["tokens_per_sample"], st["util_packed"] = used / samples, used / slots
            put(label, kind, f"{rate:.1f}")
            put(core_label, kind, f"{rate / cores:.1f}")
            put(cpu_label, kind, f"{samples / cpu:.1f}")
            put(ratio_label, kind, f"{rate / cores / st['hf']:.1f}x")

        loader = build_train_loader(data_cfg(packing=False), enc, ada, micro_batch_size=k["mbs"], seed=0)
        used = slots = 0
        for _ in range(util_batches):
            b = next(loader)
            used, slots = used + b["num_tokens"], slots + b["tokens"].numel()
        st["util_unpacked"] = used / slots
        if hasattr(loader, "close"):
            loader.close()

        if kind == "short" and not args.quick:
            # Feature cache: a second pass over the same samples skips decoding and the STFT.
            cfg = data_cfg()
            cfg.feature_cache_mb = 4096
            loader = build_train_loader(cfg, enc, ada, micro_batch_size=k["mbs"], seed=0)
            warm = 0
            while warm < loader.epoch_size:
                warm += next(loader)["num_samples"]
            start, samples = time.perf_counter(), 0
            for _ in range(util_batches):
                samples += next(loader)["num_samples"]
            if hasattr(loader, "close"):
                loader.close()
            put("end to end, later epochs (feature cache), num_workers=0", kind,
                f"{samples / (time.perf_counter() - start):.1f}")

    # CPU cores to feed one GPU, from the measured per-core rates.
    from orchestrator.plan.compose import compose

    gpu_recipes = sorted(p.stem for p in (REPO / "recipes").glob("gemma2_*.yaml"))
    for kind, st in stats.items():
        put("mean clip length (s)", kind, f"{st['seconds']:.1f}")
        put("mean tokens per sample (non-padding)", kind, f"{st['tokens_per_sample']:.0f}")
        put("token utilization, packed", kind, f"{100 * st['util_packed']:.1f}%")
        put("token utilization, one sample per row", kind, f"{100 * st['util_unpacked']:.1f}%")
        need = TOKENS_PER_GPU / st["tokens_per_sample"]
        put(f"samples/s one GPU eats at {TOKENS_PER_GPU:,} tokens/s", kind, f"{need:.1f}")
        for features_on, workers in LOADER_RUNS:
            run = f"num_workers={workers}" + (", features_on=device" if features_on == "device" else "")
            for basis, rates in (("wall-clock per-core", st["per_core"]), ("CPU-time", st["per_cpu_s"])):
                rate = rates.get((features_on, workers))
                put(f"CPU cores per GPU ({basis} rate), {run}", kind, f"{need / rate:.2f}" if rate else "not available")
        if kind != "30 s":
            continue
        # Per GPU recipe. Before: every rank of a model replica (TP x PP x CP ranks) read the
        # replica's micro-batches itself, the log-mel on the host. data.replica_reader: one of
        # them reads and the others receive (each GPU then also pays the unpickling of its
        # micro-batches). data.features_on=device: that reader decodes and tokenizes only.
        best = {on: max(r for (o, _), r in st["per_core"].items() if o == on and r) for on in ("cpu", "device")}
        send = st["send_s_per_sample"]
        for on in ("cpu", "device"):
            put(f"sending a micro-batch to a peer (pickle + unpickle), features_on={on}: ms per sample", kind,
                f"{1000 * send[on]:.2f}")
        for recipe in gpu_recipes:
            par = compose([f"+recipe={recipe}"]).parallel
            replica = par.tp * par.pp * par.cp
            before = need / best["cpu"]
            put(f"cores per GPU, {recipe} (TP {par.tp} PP {par.pp} CP {par.cp}): every rank reads", kind,
                f"{before:.2f}")
            for on, what in (("cpu", "one reader per replica"), ("device", "and the log-mel on the GPU")):
                after = need / best[on] / replica + (need * send[on] if replica > 1 else 0.0)
                put(f"cores per GPU, {recipe}: {what}", kind, f"{after:.2f} ({after / before:.2f}x)")
    tmp.cleanup()

    cols = list(kinds)
    print(f"\nData pipeline per core (torch/OpenMP/BLAS threads = 1, {cpus} CPUs usable); figures are samples/s")
    for kind, k in kinds.items():
        print(f"  {kind + ':':<7}{stats[kind]['n']} {'demo' if kind == 'short' else 'joined demo'} clips "
              f"({min(stats[kind]['n'], k['decode_clips'])} in the decode rows), {k['bins']} mel bins, "
              f"{2 * k['positions'] // 100}-s window, packed rows of {k['seq']} x {k['mbs']}")
    width = max(len(label) for label in table) + 1
    print(f"\n{'stage':<{width}}" + "".join(f"{c:>16}" for c in cols))
    print("-" * (width + 16 * len(cols)))
    for label, cells in table.items():
        print(f"{label:<{width}}" + "".join(f"{cells.get(c, '-'):>16}" for c in cols))
    print("-" * (width + 16 * len(cols)))
    print(f"Per core: wall-clock samples/s / cores used (main + workers, at most the {cpus} usable CPUs); per\n"
          f"CPU-second: samples / CPU time of the main process and its workers (other load on the machine\n"
          f"lowers the first, hardly the second). Goal: end to end per core >= 2x HF's feature extractor\n"
          f"alone (the faster of its two rows) on 30-s clips. Cores per GPU = {TOKENS_PER_GPU:,} tokens/s / mean non-padding\n"
          f"tokens per sample (prompt + audio placeholders at data.audio_tokens=clip + transcript, demo\n"
          f"tokenizer) / end-to-end samples/s per core. libsndfile {sf.__libsndfile_version__}, "
          f"miniaudio (dr_flac) {miniaudio.__version__}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
