# ruff: noqa  (vendored verbatim from the project's shared bench folder: the LLM peer of BENCH.md)
"""Reference peer: hardware ceilings and a plain PyTorch FSDP2 Llama-3-8B training step.

It is the simplest well-written baseline a user could write by hand (FSDP2, SDPA,
optional per-block torch.compile and full activation checkpointing), used as the
'peer measured in the same run' for LLM throughput. It is not part of the project.

Run on the GPU machine:  torchrun --nproc_per_node=N plain_fsdp2_llama.py AC,COMPILE [AC,COMPILE ...]
e.g. `... 1,0 1,1 0,1` runs three variants (AC = full activation checkpointing).
"""
import os, time, math, json, sys
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist

def log(*a):
    if int(os.environ.get("RANK", "0")) == 0:
        print(*a, flush=True)

def bench(fn, warm=3, it=10):
    for _ in range(warm): fn()
    torch.cuda.synchronize()
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(it): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / it / 1e3

def ceilings():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16); b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = bench(lambda: a @ b)
    log(f"matmul bf16 {n}^3: {2*n**3/t/1e12:.0f} TFLOP/s")
    x = torch.empty(2**30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
    t = bench(lambda: y.copy_(x))
    log(f"d2d copy: {2*2**30/t/1e12:.2f} TB/s")
    from torch.nn.attention import sdpa_kernel, SDPBackend
    B, H, S, D = 1, 32, 8192, 128
    q, k, v = [torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    flops_fwd = 4 * B * H * S * S * D / 2  # causal
    for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
        try:
            with sdpa_kernel(be):
                tf = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                def fb():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True); o.sum().backward()
                tfb = bench(fb)
            log(f"sdpa {name} causal S={S}: fwd {flops_fwd/tf/1e12:.0f} TFLOP/s, fwd+bwd {3.5*flops_fwd/tfb/1e12:.0f} TFLOP/s")
        except Exception as ex:
            log(f"sdpa {name}: failed {type(ex).__name__}: {str(ex)[:120]}")
    try:
        from torch.nn.attention.flex_attention import flex_attention, create_block_mask
        bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, B, H, S, S, device="cuda")
        cf = torch.compile(flex_attention)
        tf = bench(lambda: cf(q, k, v, block_mask=bm))
        def fb2():
            o = cf(q, k, v, block_mask=bm); o.sum().backward()
        tfb = bench(fb2)
        log(f"flex causal S={S}: fwd {flops_fwd/tf/1e12:.0f} TFLOP/s, fwd+bwd {3.5*flops_fwd/tfb/1e12:.0f} TFLOP/s")
    except Exception as ex:
        log(f"flex failed {type(ex).__name__}: {str(ex)[:200]}")
    try:
        import flash_attn; log("flash_attn", flash_attn.__version__)
    except Exception as ex:
        log("flash_attn not importable:", type(ex).__name__)

class RMSNorm(nn.Module):
    def __init__(s, d): super().__init__(); s.w = nn.Parameter(torch.ones(d))
    def forward(s, x): return F.rms_norm(x, (x.shape[-1],), s.w, 1e-5)

def rope(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin

class Block(nn.Module):
    def __init__(s, d, h, kv, ff):
        super().__init__(); s.h, s.kv, s.hd = h, kv, d // h
        s.n1 = RMSNorm(d); s.n2 = RMSNorm(d)
        s.wq = nn.Linear(d, d, bias=False); s.wk = nn.Linear(d, kv * s.hd, bias=False); s.wv = nn.Linear(d, kv * s.hd, bias=False); s.wo = nn.Linear(d, d, bias=False)
        s.w1 = nn.Linear(d, ff, bias=False); s.w3 = nn.Linear(d, ff, bias=False); s.w2 = nn.Linear(ff, d, bias=False)
    def forward(s, x, cos, sin):
        B, S, D = x.shape
        y = s.n1(x)
        q = s.wq(y).view(B, S, s.h, s.hd).transpose(1, 2); k = s.wk(y).view(B, S, s.kv, s.hd).transpose(1, 2); v = s.wv(y).view(B, S, s.kv, s.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + s.wo(o.transpose(1, 2).reshape(B, S, D))
        y = s.n2(x)
        return x + s.w2(F.silu(s.w1(y)) * s.w3(y))

class LM(nn.Module):
    def __init__(s, V, d, L, h, kv, ff):
        super().__init__(); s.emb = nn.Embedding(V, d); s.layers = nn.ModuleList([Block(d, h, kv, ff) for _ in range(L)]); s.norm = RMSNorm(d); s.out = nn.Linear(d, V, bias=False); s.hd = d // h
    def forward(s, idx):
        S = idx.shape[1]
        t = torch.arange(S, device=idx.device, dtype=torch.float32)
        inv = 1.0 / (500000 ** (torch.arange(0, s.hd, 2, device=idx.device, dtype=torch.float32) / s.hd))
        f = torch.outer(t, inv); f = torch.cat([f, f], -1)
        cos, sin = f.cos().to(torch.bfloat16), f.sin().to(torch.bfloat16)
        x = s.emb(idx)
        for l in s.layers: x = l(x, cos, sin)
        return s.out(s.norm(x))

def llama_fsdp(ac, compile_, S=8192, steps=8):
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    V, d, L, h, kv, ff = 128256, 4096, 32, 32, 8, 14336
    with torch.device("meta"):
        m = LM(V, d, L, h, kv, ff)
    if ac:
        for i, l in enumerate(m.layers): m.layers[i] = checkpoint_wrapper(l)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for l in m.layers:
        if compile_: l.compile()
        fully_shard(l, mp_policy=mp)
    fully_shard(m, mp_policy=mp)
    m.to_empty(device="cuda")
    for p in m.parameters(): nn.init.normal_(p, std=0.02) if p.dim() > 1 else nn.init.ones_(p)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    N = sum(p.numel() for p in m.parameters())  # DTensor numel = global
    n_emb = V * d
    flops_tok_dense = 6 * (N - n_emb) + 12 * L * d * S  # PaLM/torchtitan convention: dense attention term
    idx = torch.randint(0, V, (1, S + 1), device="cuda")
    def step():
        logits = m(idx[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, V), idx[:, 1:].reshape(-1))
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    for _ in range(2): step()
    torch.cuda.synchronize(); dist.barrier(); t = time.time()
    for _ in range(steps): step()
    torch.cuda.synchronize(); dt = (time.time() - t) / steps
    tps = S / dt
    mem = torch.cuda.max_memory_allocated() / 2**30
    log(f"llama3-8B FSDP2 ws={dist.get_world_size()} ac={ac} compile={compile_} S={S}: {dt:.3f}s/step, {tps:.0f} tok/s/GPU, "
        f"{flops_tok_dense*tps/1e12:.0f} TFLOP/s/GPU (dense-attn count, MFU {flops_tok_dense*tps/989.4e12*100:.1f}%), "
        f"peak mem {mem:.1f} GiB; params {N/1e9:.2f}B")
    del m, opt; torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()

if __name__ == "__main__":
    dist.init_process_group("nccl")
    r = dist.get_rank(); torch.cuda.set_device(r)
    log("torch", torch.__version__, "gpus", torch.cuda.device_count(), torch.cuda.get_device_name())
    if r == 0: ceilings()
    dist.barrier()
    ws = dist.get_world_size()
    for sz in (2**28,):
        x = torch.randn(sz // 2, dtype=torch.bfloat16, device="cuda")
        t = bench(lambda: dist.all_reduce(x), 2, 5)
        log(f"all_reduce {sz/2**20:.0f} MiB: busbw {2*(ws-1)/ws*sz/t/1e9:.0f} GB/s")
    for mode in sys.argv[1:]:
        ac, comp = mode.split(",")
        try:
            llama_fsdp(ac == "1", comp == "1")
        except Exception as ex:
            log("llama failed", mode, type(ex).__name__, str(ex)[:300]); torch.cuda.empty_cache()
    dist.destroy_process_group()
