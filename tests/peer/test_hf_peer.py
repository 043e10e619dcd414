"""baton against Hugging Face transformers on the same weights.

Small GPT-2 (tied and untied) and LLaMA (grouped-query) models are made in transformers
with random weights and saved with save_pretrained; baton's side is hf_peer_tool
(tests/hf_peer_tool.cc, path in BATON_HF_PEER_TOOL), which loads them with LoadHfWeights and
writes with WriteHfModel. Checked, all in float32 on the CPU with eager attention:
  - logits agree within 1e-5 relative (to the largest logit);
  - the mean cross-entropy loss agrees within 1e-5;
  - 20 AdamW steps (torch.optim.AdamW, same lr, betas, eps, weight decay: decoupled decay
    on every parameter, baton's WEIGHT_DECAY_SCOPE_ALL) give losses within 1e-4;
  - the training recipe (docs/training.md): 20 AdamW steps with warmup then cosine decay
    (torch's SequentialLR(LinearLR, CosineAnnealingLR)), global-norm clipping
    (torch.nn.utils.clip_grad_norm_) and weight decay on the matrices only (two parameter
    groups) give the same learning rates (1e-6 relative), gradient norms (1e-4 relative) and
    losses (1e-4);
  - bf16: 20 AdamW steps of baton's PRECISION_BF16 track torch.autocast(bfloat16) within a
    bound stated against autocast's own distance from float32 (see AUTOCAST_SLACK);
  - HF -> baton -> HF is bit-exact (torch.equal on every tensor);
  - the trained model baton exports has, in transformers, the loss baton reports.
Run by scripts/peer-test.sh (ctest hf_peer).
"""
import json
import os
import subprocess

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

TOOL = os.environ.get("BATON_HF_PEER_TOOL", "build/tests/hf_peer_tool")
VOCAB = 301
POSITIONS = 32
T = 16  # tokens per sample fed to the models (<= POSITIONS)
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01
STEPS = 20

torch.set_num_threads(1)


def config(kind):
    if kind.startswith("gpt2"):
        return GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                          n_positions=POSITIONS, resid_pdrop=0.0, embd_pdrop=0.0,
                          attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                          tie_word_embeddings=(kind == "gpt2_tied"))
    return LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=96, num_hidden_layers=2, vocab_size=VOCAB,
                       max_position_embeddings=POSITIONS, bos_token_id=0, eos_token_id=0,
                       tie_word_embeddings=False)


def make_model(kind, seed=0):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(kind), attn_implementation="eager")
    model = model.float()
    with torch.no_grad():
        # Every parameter random, norms and biases included, so the mapping of each shows.
        for _, p in model.named_parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def load(path):
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager",
                                                dtype=torch.float32)


def run_tool(*args):
    r = subprocess.run([TOOL, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, f"hf_peer_tool {args[0]} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def ce(model, tokens):
    x, y = tokens[:, :-1], tokens[:, 1:]
    logits = model(input_ids=x.long()).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1).long())


@pytest.fixture(params=["gpt2_tied", "gpt2_untied", "llama"])
def hf(request, tmp_path):
    kind = request.param
    model = make_model(kind)
    model.eval()
    path = tmp_path / "hf"
    model.save_pretrained(path)
    return kind, model, path


@pytest.fixture
def batches(tmp_path):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (4, 2, T + 1), generator=g, dtype=torch.int32)
    path = tmp_path / "batches.safetensors"
    save_file({"tokens": tokens.contiguous()}, str(path))
    return tokens, path


def test_logits_agree(hf, tmp_path):
    kind, model, path = hf
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, VOCAB, (3, T), generator=g, dtype=torch.int32)
    save_file({"tokens": tokens}, str(tmp_path / "tokens.safetensors"))
    run_tool("logits", "--hf", path, "--tokens", tmp_path / "tokens.safetensors",
             "--out", tmp_path / "logits.safetensors")
    ours = load_file(str(tmp_path / "logits.safetensors"))["logits"]
    with torch.no_grad():
        theirs = model(input_ids=tokens.long()).logits
    assert ours.shape == theirs.shape
    rel = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    assert rel <= 1e-5, f"{kind}: logits differ by {rel:.3g} relative"


def test_loss_agrees(hf, batches, tmp_path):
    kind, model, path = hf
    tokens, bpath = batches
    run_tool("train", "--hf", path, "--batches", bpath, "--steps", 0,
             "--out-losses", tmp_path / "losses.json")
    ours = json.loads((tmp_path / "losses.json").read_text())["final_loss"]
    with torch.no_grad():
        theirs = ce(model, tokens[0]).item()
    assert abs(ours - theirs) <= 1e-5 * max(1.0, abs(theirs)), (kind, ours, theirs)


def test_adamw_training_and_export_agree(hf, batches, tmp_path):
    kind, model, path = hf
    tokens, bpath = batches
    out = tmp_path / "trained"
    run_tool("train", "--hf", path, "--batches", bpath, "--steps", STEPS, "--lr", LR,
             "--beta1", BETAS[0], "--beta2", BETAS[1], "--eps", EPS, "--weight-decay", WD,
             "--weight-decay-scope", "all",
             "--out-losses", tmp_path / "losses.json", "--export", out)
    report = json.loads((tmp_path / "losses.json").read_text())
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    theirs = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = ce(model, tokens[step % tokens.shape[0]])
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    diffs = [abs(a - b) for a, b in zip(report["losses"], theirs)]
    assert len(report["losses"]) == STEPS
    assert max(diffs) <= 1e-4, f"{kind}: losses differ by up to {max(diffs):.3g}: " \
                               f"baton {report['losses']}, torch {theirs}"
    # The exported model, in transformers, has the loss baton reports for it.
    trained = load(out)
    trained.eval()
    with torch.no_grad():
        exported = ce(trained, tokens[0]).item()
    assert abs(exported - report["final_loss"]) <= 1e-5 * max(1.0, abs(exported)), \
        (kind, exported, report["final_loss"])


# bf16 mixed precision (docs/precision.md) against torch.autocast("cpu", torch.bfloat16):
# the two round at different points (autocast keeps the residual stream and the norms'
# outputs in float32; baton rounds block outputs, which it sends between stages), so they
# agree to bf16's resolution, not bit for bit. The bound is stated against the distance of
# each from float32: baton-bf16 must track autocast no worse than AUTOCAST_SLACK times the
# distance between autocast and float32 torch, plus AUTOCAST_ATOL; and baton-bf16 must
# differ from baton-fp32 (it really rounds).
AUTOCAST_SLACK, AUTOCAST_ATOL = 3.0, 2e-3


def torch_adamw_losses(model, tokens, autocast):
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = ce(model, tokens[step % tokens.shape[0]])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_bf16_training_tracks_torch_autocast(hf, batches, tmp_path):
    kind, _, path = hf
    tokens, bpath = batches
    ours = {}
    for precision in ("fp32", "bf16"):
        run_tool("train", "--hf", path, "--batches", bpath, "--steps", STEPS, "--lr", LR,
                 "--beta1", BETAS[0], "--beta2", BETAS[1], "--eps", EPS, "--weight-decay", WD,
                 "--weight-decay-scope", "all", "--precision", precision,
                 "--out-losses", tmp_path / f"{precision}.json")
        ours[precision] = json.loads((tmp_path / f"{precision}.json").read_text())["losses"]
    autocast = torch_adamw_losses(load(path), tokens, autocast=True)
    fp32 = torch_adamw_losses(load(path), tokens, autocast=False)
    gap = max(abs(a - b) for a, b in zip(autocast, fp32))  # what bf16 does to torch
    diff = max(abs(a - b) for a, b in zip(ours["bf16"], autocast))
    rounding = max(abs(a - b) for a, b in zip(ours["bf16"], ours["fp32"]))
    print(f"{kind}: |baton bf16 - autocast| <= {diff:.3g}, |autocast - torch fp32| <= {gap:.3g}, "
          f"|baton bf16 - baton fp32| <= {rounding:.3g}")
    assert rounding > 0, f"{kind}: bf16 gave the fp32 losses: nothing was rounded"
    assert diff <= AUTOCAST_SLACK * gap + AUTOCAST_ATOL, \
        f"{kind}: baton bf16 {ours['bf16']} vs autocast {autocast} (torch fp32 {fp32})"


WARMUP, MIN_LR, CLIP = 4, 1e-4, 0.5


def matrices(kind, model):
    """WEIGHT_DECAY_SCOPE_MATRICES in transformers' names: 2-D weights but the embeddings (a
    tied lm_head is the embedding, and named_parameters lists it once, as wte)."""
    embeddings = ("wte.weight", "wpe.weight", "embed_tokens.weight")
    decay, rest = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.endswith(embeddings) else rest).append(p)
    return decay, rest


def test_recipe_matches_torch(hf, batches, tmp_path):
    kind, model, path = hf
    tokens, bpath = batches
    run_tool("train", "--hf", path, "--batches", bpath, "--steps", STEPS, "--lr", LR,
             "--beta1", BETAS[0], "--beta2", BETAS[1], "--eps", EPS, "--weight-decay", 0.1,
             "--weight-decay-scope", "matrices", "--warmup", WARMUP, "--decay", "cosine",
             "--min-lr", MIN_LR, "--clip", CLIP, "--out-losses", tmp_path / "losses.json")
    report = json.loads((tmp_path / "losses.json").read_text())
    model.train()
    decay, rest = matrices(kind, model)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / WARMUP, end_factor=1.0,
                                               total_iters=WARMUP - 1)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS - WARMUP,
                                                        eta_min=MIN_LR)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warmup, cosine], milestones=[WARMUP])
    losses, lrs, norms = [], [], []
    for step in range(STEPS):
        opt.zero_grad()
        loss = ce(model, tokens[step % tokens.shape[0]])
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item())
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        losses.append(loss.item())
    assert len(report["lrs"]) == STEPS and len(report["grad_norms"]) == STEPS
    for step, (ours, theirs) in enumerate(zip(report["lrs"], lrs)):
        assert abs(ours - theirs) <= 1e-6 * theirs, (kind, step, ours, theirs)
    assert sum(n > CLIP for n in norms) >= STEPS // 2, f"{kind}: the bound seldom clips: {norms}"
    for step, (ours, theirs) in enumerate(zip(report["grad_norms"], norms)):
        assert abs(ours - theirs) <= 1e-4 * theirs, (kind, step, ours, theirs)
    diffs = [abs(a - b) for a, b in zip(report["losses"], losses)]
    assert max(diffs) <= 1e-4, f"{kind}: losses differ by up to {max(diffs):.3g}: " \
                               f"baton {report['losses']}, torch {losses}"


def test_round_trip_is_bit_exact(hf, tmp_path):
    kind, model, path = hf
    out = tmp_path / "back"
    run_tool("roundtrip", "--hf", path, "--out", out)
    src = load_file(str(path / "model.safetensors"))
    back = load_file(str(out / "model.safetensors"))
    for name, t in src.items():
        if name.endswith(".attn.bias") or name.endswith(".attn.masked_bias"):
            continue  # GPT-2's mask buffers, not parameters
        assert name in back, f"{kind}: {name} missing after the round trip"
        assert torch.equal(t, back[name]), f"{kind}: {name} changed"
    assert set(back) <= set(src), f"{kind}: extra tensors {set(back) - set(src)}"
    # And transformers reads the written directory as the same model.
    again = load(out)
    again.eval()
    for (n1, p1), (n2, p2) in zip(model.named_parameters(), again.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2), f"{kind}: {n1} differs after from_pretrained"


def test_sharded_bf16_checkpoint_loads(tmp_path):
    """A bf16 LLaMA saved in several shards (model.safetensors.index.json), as hub files are:
    baton's logits equal transformers' on the same weights widened to float32."""
    model = make_model("llama").to(torch.bfloat16)
    path = tmp_path / "hf"
    model.save_pretrained(path, max_shard_size="100KB")
    assert (path / "model.safetensors.index.json").exists()
    reference = load(path)  # the bf16 weights, widened to float32
    reference.eval()
    assert next(reference.parameters()).dtype == torch.float32
    tokens = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(3),
                           dtype=torch.int32)
    save_file({"tokens": tokens}, str(tmp_path / "tokens.safetensors"))
    run_tool("logits", "--hf", path, "--tokens", tmp_path / "tokens.safetensors",
             "--out", tmp_path / "logits.safetensors")
    ours = load_file(str(tmp_path / "logits.safetensors"))["logits"]
    with torch.no_grad():
        theirs = reference(input_ids=tokens.long()).logits
    rel = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    assert rel <= 1e-5, f"logits differ by {rel:.3g} relative"


BATONCTL = os.environ.get("BATON_BATONCTL", "build/bin/batonctl")


@pytest.mark.parametrize("pipeline", [False, True], ids=["reference", "pipeline"])
@pytest.mark.parametrize("kind", ["gpt2_tied", "llama"])
def test_batonctl_starts_from_hf_and_exports_hf(kind, pipeline, tmp_path):
    """batonctl train-local honours init.from_hf (one process, or two pipeline stages each
    loading its own blocks) and export --format hf writes the weights back. With a learning
    rate far below every weight's rounding step, training leaves the weights as they were, so
    the exported model must be the loaded one, bit for bit."""
    if not os.access(BATONCTL, os.X_OK):
        pytest.skip(f"no batonctl at {BATONCTL} (set BATON_BATONCTL)")
    model = make_model(kind)
    src = tmp_path / "hf"
    model.save_pretrained(src)
    c = model.config
    arch = ({"gpt": {"vocabSize": VOCAB, "context": T, "dModel": c.n_embd, "heads": c.n_head,
                     "layers": c.n_layer}}
            if kind.startswith("gpt2") else
            {"llama": {"vocabSize": VOCAB, "context": T, "dModel": c.hidden_size,
                       "heads": c.num_attention_heads, "kvHeads": c.num_key_value_heads,
                       "layers": c.num_hidden_layers, "intermediateSize": c.intermediate_size,
                       "rmsNormEps": c.rms_norm_eps}})
    spec = {
        "name": "peer", "model": arch,
        "data": {"text": {"inlineText": "the quick brown fox jumps over the lazy dog. " * 8},
                 "batchSize": 2},
        "pipeline": {"stages": 2, "microbatches": 2, "schedule": "SCHEDULE_1F1B"},
        "optimizer": {"sgd": {"learningRate": 1e-30}},
        "init": {"fromHf": str(src)},
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "everySteps": 1},
        "steps": 1, "seed": 3,
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    cmd = [BATONCTL, "train-local", "-f", tmp_path / "spec.json", "--job-id", "peer"]
    r = subprocess.run(cmd + (["--pipeline"] if pipeline else []), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "exported"
    r = subprocess.run([BATONCTL, "export", "--from", tmp_path / "ckpt" / "peer", "--spec",
                        tmp_path / "spec.json", "--format", "hf", "-o", out],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    want = load_file(str(src / "model.safetensors"))
    got = load_file(str(out / "model.safetensors"))
    for name, t in got.items():
        # wpe too: every imported row, though the spec's context is shorter than n_positions
        assert torch.equal(t, want[name]), f"{kind}: {name} changed"
    assert {n for n in want if not n.endswith((".attn.bias", ".attn.masked_bias"))} == set(got)
    again = load(out)
    assert again.config.model_type == c.model_type
    assert again.config.max_position_embeddings == POSITIONS  # the imported context, not T
    assert again.config.bos_token_id == 0 and again.config.eos_token_id == 0


BF16_KINDS = ["gpt2_tied", "llama"]


def batonctl_spec(kind, c, src, context, steps, lr, tmp_path, precision=None):
    arch = ({"gpt": {"vocabSize": VOCAB, "context": context, "dModel": c.n_embd,
                     "heads": c.n_head, "layers": c.n_layer}}
            if kind.startswith("gpt2") else
            {"llama": {"vocabSize": VOCAB, "context": context, "dModel": c.hidden_size,
                       "heads": c.num_attention_heads, "kvHeads": c.num_key_value_heads,
                       "layers": c.num_hidden_layers, "intermediateSize": c.intermediate_size,
                       "rmsNormEps": c.rms_norm_eps}})
    g = torch.Generator().manual_seed(4)
    text = "".join(chr(97 + int(i)) for i in torch.randint(0, 26, (4096,), generator=g))
    spec = {"name": "peer", "model": arch,
            "data": {"text": {"inlineText": text}, "batchSize": 2},
            "optimizer": {"adamw": {"learningRate": lr}},
            "init": {"fromHf": str(src)},
            "checkpoint": {"dir": str(tmp_path / "ckpt"), "everySteps": steps},
            "steps": steps, "seed": 3}
    if precision:
        spec["precision"] = precision
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def train_and_export(spec_path, tmp_path, *export_args):
    r = subprocess.run([BATONCTL, "train-local", "-f", spec_path, "--job-id", "peer"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "exported"
    r = subprocess.run([BATONCTL, "export", "--from", tmp_path / "ckpt" / "peer", "--spec",
                        spec_path, "--format", "hf", "-o", out, *export_args],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


@pytest.mark.parametrize("kind", BF16_KINDS)
def test_a_bf16_export_loads_as_bf16(kind, tmp_path):
    """export --dtype bf16 says bfloat16 where transformers reads it: from_pretrained without
    a dtype gives bfloat16 parameters, each the float32 master rounded to nearest even."""
    if not os.access(BATONCTL, os.X_OK):
        pytest.skip(f"no batonctl at {BATONCTL} (set BATON_BATONCTL)")
    model = make_model(kind)
    src = tmp_path / "hf"
    model.save_pretrained(src)
    spec = batonctl_spec(kind, model.config, src, T, 1, 1e-30, tmp_path, "PRECISION_BF16")
    out = train_and_export(spec, tmp_path, "--dtype", "bf16")
    loaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    params = dict(loaded.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.bfloat16}
    want = dict(model.named_parameters())
    for name, p in params.items():
        assert torch.equal(p, want[name].detach().to(torch.bfloat16)), f"{kind}: {name}"


def test_a_fine_tuned_gpt2_keeps_its_imported_context(tmp_path):
    """GPT-2 imported with 128 positions, fine-tuned at context 64: the export keeps all 128
    position rows (0..63 trained, 64..127 as imported) and n_positions 128, so a 100-token
    input runs in transformers and gives the logits baton gives on the exported model."""
    if not os.access(BATONCTL, os.X_OK):
        pytest.skip(f"no batonctl at {BATONCTL} (set BATON_BATONCTL)")
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=128,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=5,
                     eos_token_id=7)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float()
    src = tmp_path / "hf"
    model.save_pretrained(src)
    (src / "tokenizer_config.json").write_text('{"model_max_length": 128}')
    spec = batonctl_spec("gpt2_tied", model.config, src, 64, 3, 1e-3, tmp_path)
    out = train_and_export(spec, tmp_path)
    tuned = load(out)
    tuned.eval()
    assert tuned.config.n_positions == 128
    assert (tuned.config.bos_token_id, tuned.config.eos_token_id) == (5, 7)
    assert (out / "tokenizer_config.json").read_text() == '{"model_max_length": 128}'
    wpe, imported = tuned.transformer.wpe.weight, model.transformer.wpe.weight
    assert wpe.shape == (128, 64)
    assert torch.equal(wpe[64:], imported[64:]), "rows past the context changed"
    assert not torch.equal(wpe[:64], imported[:64]), "the trained rows did not train"
    tokens = torch.randint(0, VOCAB, (2, 100), generator=torch.Generator().manual_seed(5),
                           dtype=torch.int32)
    save_file({"tokens": tokens}, str(tmp_path / "tokens.safetensors"))
    run_tool("logits", "--hf", out, "--tokens", tmp_path / "tokens.safetensors",
             "--out", tmp_path / "logits.safetensors")
    ours = load_file(str(tmp_path / "logits.safetensors"))["logits"]
    with torch.no_grad():
        theirs = tuned(input_ids=tokens.long()).logits
    rel = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    assert rel <= 1e-5, f"logits on 100 tokens differ by {rel:.3g} relative"


def byte_level_tokenizer(path):
    """A byte-level BPE of at most VOCAB ids, trained here as scripts/prepare-data.py does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog. " * 20,
                             "pack my box with five dozen liquor jugs; " * 20], trainer=trainer)
    tok.save(str(path))
    return tok


@pytest.mark.parametrize("kind", ["gpt2_tied", "gpt2_untied", "llama"])
def test_greedy_sample_equals_generate(kind, tmp_path):
    """batonctl sample --temperature 0 on a model directory gives, token for token, what
    transformers' generate gives without sampling, and encodes and decodes with the
    directory's tokenizer.json as the tokenizers library does."""
    if not os.access(BATONCTL, os.X_OK):
        pytest.skip(f"no batonctl at {BATONCTL} (set BATON_BATONCTL)")
    model = make_model(kind)
    model.eval()
    src = tmp_path / "hf"
    model.save_pretrained(src)
    tok = byte_level_tokenizer(src / "tokenizer.json")
    prompt = "the lazy dog jumps"
    ids = tok.encode(prompt).ids
    n = POSITIONS - len(ids)  # as far as GPT-2's position table goes
    r = subprocess.run([BATONCTL, "sample", "--hf", src, "--prompt", prompt, "--tokens", str(n),
                        "--temperature", "0", "--output", "json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    ours = json.loads(r.stdout)
    assert ours["prompt_ids"] == ids
    model.generation_config.eos_token_id = None  # the whole n tokens, as baton gives them
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                             max_new_tokens=n, do_sample=False, pad_token_id=0)
    theirs = out[0, len(ids):].tolist()
    assert ours["ids"] == theirs, f"{kind}: greedy tokens differ"
    assert ours["text"] == tok.decode(theirs)
    # Sampling is a function of the seed.
    runs = [subprocess.run([BATONCTL, "sample", "--hf", src, "--prompt", prompt, "--tokens", "8",
                            "--seed", str(seed), "--temperature", "1.0", "--output", "json"],
                           capture_output=True, text=True) for seed in (1, 1, 2)]
    assert all(x.returncode == 0 for x in runs), [x.stderr for x in runs]
    a, b, _ = (json.loads(x.stdout)["ids"] for x in runs)
    assert a == b
