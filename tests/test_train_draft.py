"""`dflash train-draft` (engines/cuda/training/): the batched objective matches the decoding loop, a few
seeded steps lower the loss and raise the measured acceptance length, the saved draft reloads in both
engines and stays lossless, an interrupted run resumes where it stopped, and bad input exits 2.

The target is a tiny Qwen3 trained here for a few dozen steps to continue the alphabet after a user's
letter, so its greedy responses are predictable and a draft can learn them (self-distillation).
"""

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dflash_tui.engines import EngineConfig, GenerationRequest, load_engine
from dflash_tui.engines.cuda.training import Interrupted, TrainConfig, Trainer, default_gamma, given_response_ids, load_conversations
from tests import tiny

LETTERS = "abcdefghijklmnopqrstuvwxyz"
NEW = 40


def alphabet(start: str, n: int) -> str:
    i = LETTERS.index(start)
    return "".join(LETTERS[(i + k) % 26] for k in range(n))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def counting(tmp_path_factory):
    """(target dir, data file): a tiny target that continues the alphabet, and 40 one-letter prompts."""
    import transformers

    root = tmp_path_factory.mktemp("counting")
    out = root / "target"
    tok = tiny.make_tokenizer(out)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    config = transformers.Qwen3Config(
        vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=False, eos_token_id=eos)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        batch = []
        for _ in range(16):
            s = LETTERS[int(torch.randint(26, (1,), generator=g))]
            prompt = tok.apply_chat_template([{"role": "user", "content": s}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False)
            batch.append(list(prompt) + tok.encode(alphabet(s, 60)[1:], add_special_tokens=False))
        n = min(len(b) for b in batch)
        ids = torch.tensor([b[:n] for b in batch])
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(str(out))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos], "do_sample": False}))
    data = root / "data.jsonl"
    lines = [{"turns": [LETTERS[i % 26]]} for i in range(34)]
    lines += [{"messages": [{"role": "user", "content": LETTERS[i]}], "thinking": False} for i in range(3, 9)]
    data.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return out, data


def config(counting, out, **kw) -> TrainConfig:
    target, data = counting
    base = dict(target=str(target), data=str(data), out=str(out), block_size=8, max_len=64, max_new_tokens=NEW,
                batch_size=4, epochs=50, val_prompts=4, val_max_new=NEW, seed=0)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def trained(counting, tmp_path_factory):
    """One seeded 80-step run: (trainer, result, tau of the untrained draft, losses per step)."""
    out = tmp_path_factory.mktemp("trained") / "draft"
    trainer = Trainer(config(counting, out, max_steps=80))
    train, held = trainer.split()
    tau0 = trainer.estimate_tau(trainer.val_prompts(held))
    losses = []
    result = trainer.run(on_step=lambda p: losses.append(p.loss) if p.kind == "step" else None)
    return trainer, result, tau0, losses


def test_batched_blocks_match_the_decoding_loop(counting, tmp_path):
    """Many anchors in one masked pass give the same block hidden states as the loop's DraftCache
    (context strictly before the anchor, bidirectional block), including a draft reading the last layer."""
    trainer = Trainer(config(counting, tmp_path / "d", target_layer_ids="1,3"))
    assert_batched_blocks_match_the_loop(trainer, trainer.draft)


def assert_batched_blocks_match_the_loop(trainer, draft) -> None:
    """The objective's one masked pass over four blocks of a sequence against DraftCache, block by block."""
    from transformers import DynamicCache

    from dflash_tui.engines.cuda.draft import DraftCache

    tok = trainer.tokenizer
    seq = tok.apply_chat_template([{"role": "user", "content": "k"}], add_generation_prompt=True, tokenize=True,
                                  return_dict=False)
    seq = list(seq) + tok.encode(alphabet("k", 30)[1:], add_special_tokens=False)
    ids = torch.tensor([seq])
    anchors = torch.tensor([[5, 9, 14, 20]])
    with torch.no_grad():
        batched = trainer.objective.block_hiddens(ids, trainer.objective.features(ids), anchors)
        _, features = trainer.target.forward(ids, 0, DynamicCache(config=trainer.target.model.config),
                                             last_only=False, capture=True)
        for j, a in enumerate(anchors[0].tolist()):
            cache = DraftCache(draft, None)
            cache.append(features[:, :a])
            block = torch.full((1, 8), trainer.mask_id)
            block[0, 0] = seq[a]
            expected = cache.hidden(draft.embed(trainer.target.embed, block))
            torch.testing.assert_close(batched[0, j], expected[0], atol=1e-4, rtol=1e-4)


def test_training_lowers_loss_and_raises_acceptance(trained):
    trainer, result, tau0, losses = trained
    assert result.steps == 80 and len(losses) == 80
    assert losses[-1] < 0.5 * losses[0]
    assert tau0 < 1.5
    assert result.tau > tau0 + 1.5, (tau0, result.taus)
    print(f"tau {tau0:.2f} -> {result.tau:.2f} at block 8 in 80 steps; {result.steps_per_s:.1f} step/s, "
          f"{result.tokens_per_s:.0f} tok/s")
    out = Path(result.out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["block_size"] == 8 and cfg["dflash_config"]["mask_token_id"] == tok_id(trainer, "<|mask|>")
    assert cfg["architectures"] == ["DFlashDraftModel"] and "rope_theta" in cfg
    assert (out / "model.safetensors").is_file() and (out / "responses.jsonl").is_file()


def test_bfloat16_compute_keeps_the_objective(counting, tmp_path):
    """--compute bfloat16 (the auto choice on this CPU and on GPUs) gives the float32 loss within rounding."""
    losses = {}
    for compute in ("float32", "bfloat16"):
        trainer = Trainer(config(counting, tmp_path / compute, compute=compute))
        assert trainer.objective.autocast == (compute == "bfloat16")
        batch = trainer.samples(trainer.split()[0])[:4]
        losses[compute] = trainer.objective.loss(batch, torch.Generator().manual_seed(0))[0].item()
    assert abs(losses["bfloat16"] - losses["float32"]) < 0.02 * losses["float32"], losses


def tok_id(trainer, token):
    return trainer.tokenizer.convert_tokens_to_ids(token)


def greedy_reference(target_dir, prompt_ids, max_new):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new, do_sample=False, eos_token_id=None,
                         pad_token_id=0, min_new_tokens=max_new)
    return out[0, len(prompt_ids):].tolist()


def engines_available():
    names = ["cuda"]
    try:
        import mlx_lm  # noqa: F401 - importable means the engine can run

        import dflash_tui.engines.mlx.engine  # noqa: F401 - importable means the engine can run
        names.append("mlx")
    except ImportError:
        pass
    return names


@pytest.mark.parametrize("engine", ["cuda", "mlx"])
def test_saved_draft_reloads_and_stays_lossless(counting, trained, engine):
    if engine not in engines_available():
        pytest.skip("the MLX engine (engines.mlx.engine with mlx-lm) is not available in this build")
    target, _ = counting
    _, result, _, _ = trained
    eng = load_engine(EngineConfig(target=str(target), draft=result.out, engine=engine))
    taus = []
    for letter in "qz":
        ids = eng.prepare(GenerationRequest(messages=[{"role": "user", "content": letter}]))
        expected = greedy_reference(target, ids, NEW)
        for block in (1, 4, 16):
            list(eng.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=NEW, temperature=0, block_size=block,
                                                stop_ids=[])))
            assert eng.last_summary.token_ids == expected, f"{engine} block {block} letter {letter}"
            if block == 4:
                taus.append(eng.last_summary.mean_acceptance_length)
    print(engine, taus)
    assert min(taus) > 2.0, taus  # the trained draft's proposals are accepted in the real engine too


def run_cli(args):
    from dflash_tui.cli import main

    return CliRunner().invoke(main, ["train-draft", *args])


def cli_args(counting, out, *extra):
    target, data = counting
    return ["--target", str(target), "--data", str(data), "--out", str(out), "--block-size", "4", "--max-len", "48",
            "--max-new-tokens", "24", "--batch-size", "4", "--val-prompts", "2", "--val-max-new", "16",
            "--anchors-per-seq", "4", "--epochs", "20", *extra]


def test_cli_resumes_where_it_stopped(counting, tmp_path):
    out = tmp_path / "draft"
    first = run_cli(cli_args(counting, out, "--max-steps", "6", "--dtype", "float16"))
    assert first.exit_code == 0, first.output
    assert first.output.strip().splitlines()[-1].startswith("tau ")
    lines = first.output.splitlines()  # not a terminal here: plain lines say where training is, to the end
    assert any(re.fullmatch(r"responses (\d+)/\1", line) for line in lines), first.output
    steps = [line for line in lines if line.startswith("training ")]
    assert steps[-1].startswith("training 6/6 loss ") and len(steps) <= 21, steps
    assert torch.load(out / "train_state.pt", weights_only=True)["step"] == 6
    responses = (out / "responses.jsonl").read_text()
    second = run_cli(cli_args(counting, out, "--max-steps", "12", "--dtype", "float16"))
    assert second.exit_code == 0, second.output
    assert "resuming at step 6" in second.output
    assert torch.load(out / "train_state.pt", weights_only=True)["step"] == 12
    assert (out / "responses.jsonl").read_text() == responses  # generated once, reused
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float16"
    target, _ = counting
    for engine in engines_available():  # a half-precision draft loads (upcast) and stays lossless
        eng = load_engine(EngineConfig(target=str(target), draft=str(out), engine=engine))
        ids = eng.prepare(GenerationRequest(messages=[{"role": "user", "content": "m"}]))
        list(eng.generate(GenerationRequest(prompt_ids=ids, max_new_tokens=16, temperature=0, block_size=4, stop_ids=[])))
        assert eng.last_summary.token_ids == greedy_reference(target, ids, 16), engine
    changed = run_cli(cli_args(counting, out, "--max-steps", "12", "--lr", "0.01"))
    assert changed.exit_code == 2 and "--fresh" in changed.output


def test_interrupt_saves_state_and_resumes(counting, tmp_path):
    out = tmp_path / "draft"

    def interrupt(p):
        if p.kind == "step" and p.done == 5:
            raise KeyboardInterrupt

    with pytest.raises(Interrupted) as info:
        Trainer(config(counting, out, max_steps=10)).run(on_step=interrupt)
    assert info.value.step == 5
    assert torch.load(out / "train_state.pt", weights_only=True)["step"] == 5
    claim = json.loads((out / ".dflash-train-draft").read_text())  # the claim, not a published draft, makes it ours
    assert claim["written_by"] == "dflash train-draft" and not (out / "training.json").exists()
    seen = []
    result = Trainer(config(counting, out, max_steps=10)).run(on_step=lambda p: seen.append((p.kind, p.done)))
    assert ("info", 5) in seen and [d for k, d in seen if k == "step"] == [6, 7, 8, 9, 10]
    assert result.steps == 10


def test_a_run_that_stops_inside_its_first_epoch_reports_epoch_1(counting, tmp_path):
    """The last validation names the epoch it ran in (it said "epoch 0" for a run shorter than one)."""
    reports: list = []
    Trainer(config(counting, tmp_path / "d", max_steps=2, batch_size=2)).run(on_step=reports.append)
    assert [p.epoch for p in reports if p.kind == "validate"] == [1]


def test_batched_generation_matches_the_loop_and_work_dir(counting, tmp_path):
    one = Trainer(config(counting, tmp_path / "a", max_new_tokens=24))
    many = Trainer(config(counting, tmp_path / "b", max_new_tokens=24, gen_batch=8, work_dir=str(tmp_path / "w")))
    convs = one.conversations[:6] + one.conversations[-2:]  # both thinking modes
    a, b = one.samples(convs), many.samples(convs)
    assert [s.response for s in a] == [s.response for s in b]
    assert all(1 <= len(s.response) <= 24 for s in a) and sum(len(s.response) for s in a) > 100
    assert (tmp_path / "w" / "responses.jsonl").is_file()
    assert [p.name for p in (tmp_path / "b").iterdir()] == [".dflash-train-draft"]  # claimed; its work went to w
    assert [s.response for s in many.samples(convs)] == [s.response for s in b]  # read back from the cache


def test_given_responses_and_data_formats(counting, tmp_path):
    target, _ = counting
    data = tmp_path / "given.jsonl"
    data.write_text(json.dumps({"turns": ["b", "cdefghijklmnop", "x", "yzabcdefgh"]}) + "\n"
                    + json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "c"},
                                               {"role": "assistant", "content": "defghijk"}], "thinking": False}) + "\n")
    convs = load_conversations(str(data))
    assert [len(c.messages) for c in convs] == [4, 3] and [c.thinking for c in convs] == [True, False]
    trainer = Trainer(config(counting, tmp_path / "d", data=str(data), responses="given"))
    samples = trainer.samples(convs)
    assert len(samples) == 3
    eos = trainer.eos
    for s in samples:
        assert s.response[-1] in eos
    assert trainer.tokenizer.decode(samples[0].response[:-1]).strip() == "cdefghijklmnop"
    assert given_response_ids(trainer.tokenizer, [{"role": "user", "content": "b"}], "cd", True, eos)[-1] in eos
    assert default_gamma(16) == 7 and default_gamma(8) == 4


@pytest.mark.parametrize("extra,needle", [
    (["--block-size", "1"], "block size"),
    (["--block-size", "100"], "block size"),
    (["--target-layer-ids", "0,7"], "outside"),
    (["--target-layer-ids", "1,x"], "comma-separated"),
    (["--target-layer-ids", "1,1"], "repeats"),
    (["--mask-token", "no such token at all"], "mask-token"),
])
def test_bad_options_exit_2(counting, tmp_path, extra, needle):
    target, data = counting
    result = run_cli(["--target", str(target), "--data", str(data), "--out", str(tmp_path / "o"), *extra])
    assert result.exit_code == 2, result.output
    assert needle in result.output.lower() and len(result.output.strip().splitlines()) == 1


def test_bad_data_exits_2_naming_file_and_line(counting, tmp_path):
    target, _ = counting
    missing = run_cli(["--target", str(target), "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"turns": ["a"]}) + "\n{not json\n")
    result = run_cli(["--target", str(target), "--data", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and f"{bad}:2" in result.output, result.output
    bad.write_text(json.dumps({"turns": ["a"]}) + "\n" + json.dumps({"turns": "a"}) + "\n")
    result = run_cli(["--target", str(target), "--data", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and f"{bad}:2" in result.output
    result = run_cli(["--target", str(tmp_path / "nowhere"), "--data", str(counting[1]), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "nowhere" in result.output


def test_init_draft_starts_from_its_weights_and_must_match(counting, trained, tmp_path):
    """--init-draft fine-tunes an existing draft: training begins at its weights (so at its acceptance),
    a draft of another shape is refused in one sentence, and a saved state from another start is not resumed."""
    first, result, tau0, _ = trained
    trainer = Trainer(config(counting, tmp_path / "tuned", init_draft=result.out))
    saved = trainer.draft.state_dict()
    for name, tensor in first.draft.state_dict().items():
        torch.testing.assert_close(saved[name], tensor.to(saved[name].dtype), atol=1e-3, rtol=1e-3)  # stored float16
    _, held = trainer.split()
    assert trainer.estimate_tau(trainer.val_prompts(held)) > tau0 + 1.0  # begins where the first run ended
    assert trainer.key()["init_draft"] and Trainer(config(counting, tmp_path / "x")).key()["init_draft"] is None

    wider = run_cli(cli_args(counting, tmp_path / "o", "--init-draft", result.out))  # it sets block 4
    assert wider.exit_code == 2 and "--init-draft" in wider.output and "block_size" in wider.output, wider.output
    assert len(wider.output.strip().splitlines()) == 1
    missing = run_cli(cli_args(counting, tmp_path / "o", "--init-draft", str(tmp_path / "nowhere")))
    assert missing.exit_code == 2, missing.output


# -- where train-draft may write (engines/outputs.py): new, empty or its own folders, checked before any work --


def with_data(args, data):
    return [str(data) if i and args[i - 1] == "--data" else a for i, a in enumerate(args)]


def assert_refused(result, *phrases):
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and "unexpected" not in result.output, result.output
    for phrase in phrases:
        assert phrase in result.output, result.output


def test_refuses_a_folder_of_the_users_files_and_leaves_them(counting, tmp_path):
    """A folder with a README.md of the user's (or $HOME) is not a new, empty or train-draft folder: refused,
    naming it and the file, before anything is written there (it used to get the card over its README.md)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes\n")
    result = run_cli(cli_args(counting, mine, "--max-steps", "1"))
    assert_refused(result, f"--out {mine}", "README.md", "new or empty folder")
    assert [p.name for p in mine.iterdir()] == ["README.md"] and (mine / "README.md").read_text() == "my notes\n"
    work = run_cli(cli_args(counting, tmp_path / "draft", "--work-dir", str(mine), "--max-steps", "1"))
    assert_refused(work, f"--work-dir {mine}", "README.md")
    assert [p.name for p in mine.iterdir()] == ["README.md"] and not (tmp_path / "draft").exists()


@pytest.mark.parametrize("option,inside", [("--out", "responses.jsonl"), ("--work-dir", "responses.jsonl"),
                                           ("--out", "sub/chats.jsonl")])
def test_refuses_data_inside_the_folders_it_writes(counting, tmp_path, option, inside):
    """--data inside --out or --work-dir, even one train-draft owns, is refused before anything is written
    (responses.jsonl there used to gain the generated responses cache)."""
    folder = tmp_path / "run"
    folder.mkdir()
    # a draft an earlier train-draft published there: the folder is ours
    (folder / "training.json").write_text('{"written_by": "dflash train-draft"}')
    data = folder / inside
    data.parent.mkdir(exist_ok=True)
    data.write_bytes(counting[1].read_bytes())
    before = sorted(str(p) for p in folder.rglob("*"))
    out = folder if option == "--out" else tmp_path / "draft"
    extra = ["--work-dir", str(folder)] if option == "--work-dir" else []
    result = run_cli(with_data(cli_args(counting, out, "--max-steps", "1", *extra), data))
    assert_refused(result, f"--data {data}", f"{option} {folder}")
    assert data.read_bytes() == counting[1].read_bytes() and sorted(str(p) for p in folder.rglob("*")) == before
    assert not (tmp_path / "draft").exists()


def test_unwritable_folders_are_refused_before_training(counting, tmp_path):
    """A folder that cannot be created or claimed (under a plain file: ENOTDIR; under /proc) is a one-sentence
    refusal, exit 2, before any weight loads; it used to train fully and then fail with exit 1."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    cases = [("--out", a_file / "draft"), ("--work-dir", a_file / "work")]
    if Path("/proc/self").is_dir():
        cases.append(("--out", Path("/proc/dflash-train-draft-test")))
    for option, folder in cases:
        out = folder if option == "--out" else tmp_path / "draft"
        extra = ["--work-dir", str(folder)] if option == "--work-dir" else []
        result = run_cli(cli_args(counting, out, "--max-steps", "1", *extra))
        assert_refused(result, f"{option} {folder}", "cannot be written")
    assert a_file.read_text() == "mine"


def test_ownership_rule(tmp_path):
    """New, empty, claimed (an interrupted run: claim + train_state.pt, no training.json) and published
    folders pass; anything else is refused; a claim is a hidden JSON file saying who wrote it and when."""
    from dflash_tui.engines.errors import UserError
    from dflash_tui.engines.outputs import CLAIM, check_output_dir, claim_output_dir

    target, data = tmp_path / "target", tmp_path / "data.jsonl"
    target.mkdir()
    data.write_text("{}\n")

    def check(folder, option="--out"):
        check_output_dir(folder, option=option, target=target, data=data)

    new = tmp_path / "a" / "b"
    check(new)
    claim_output_dir(new, option="--out")
    made = json.loads((new / CLAIM).read_text())
    assert made["written_by"] == "dflash train-draft" and made["claimed_at"]
    assert [p.name for p in new.iterdir()] == [CLAIM]  # no temp file left beside it
    (new / "train_state.pt").write_bytes(b"state")
    (new / "responses.jsonl").write_text("")
    check(new)  # interrupted: a rerun resumes
    claim_output_dir(new, option="--out")  # claiming again is harmless
    empty = tmp_path / "empty"
    empty.mkdir()
    check(empty, "--work-dir")
    published = tmp_path / "published"
    published.mkdir()
    (published / "training.json").write_text('{"written_by": "dflash train-draft"}')
    (published / "model.safetensors").write_bytes(b"")
    check(published)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(UserError, match="already holds a model"):
        check(model)
    for folder in (new, published):
        with pytest.raises(UserError, match="--data"):
            check_output_dir(folder, option="--out", target=target, data=folder / "responses.jsonl")


# -- DFlash 2 (docs/dflash2.md, "Training") ---------------------------------------------------------------

@pytest.mark.parametrize("variant", [dict(), dict(causal=True), dict(sliding_window=5, causal=None)],
                         ids=["published", "causal", "sliding"])
def test_batched_dflash2_blocks_match_the_decoding_loop(counting, tmp_path, variant):
    """The objective's one masked pass over many blocks equals the loop's DraftCache for a DFlash 2 draft:
    its convolutions stay inside each block, and causal and sliding layers see what the loop shows them."""
    from dflash_tui.engines.checkpoints import DraftInfo
    from dflash_tui.engines.cuda.draft import DFlashDraft
    from tests.tiny_dflash2 import make_dflash2_draft

    trainer = Trainer(config(counting, tmp_path / "d", target_layer_ids="1,3", arch="dflash2"))
    target, _ = counting
    folder = make_dflash2_draft(tmp_path / "d2", target, [1, 3], block_size=8, **variant)
    trainer.objective.draft = draft = DFlashDraft.load(DraftInfo.read(str(folder)), torch.device("cpu"), torch.float32)
    assert_batched_blocks_match_the_loop(trainer, draft)


def test_dflash2_starts_from_a_dflash1_draft_and_loads_in_both_engines(counting, trained, tmp_path):
    """--arch dflash2 --init-draft DFLASH1: the backbone is the DFlash 1 draft's and the convolutions start
    as the identity (so the acceptance starts where DFlash 1 ended); after training the output is in the
    published DFlash 2 layout and both engines load it, lossless at T = 0. A DFlash 2 draft cannot be
    continued as DFlash 1."""
    from safetensors import safe_open

    from tests.oracles import engine_for, run, transformers_greedy

    first, result, _, _ = trained
    trainer = Trainer(config(counting, tmp_path / "d2", arch="dflash2", init_draft=result.out, max_steps=30))
    for name, tensor in first.draft.state_dict().items():
        torch.testing.assert_close(trainer.draft.state_dict()[name], tensor, atol=1e-3, rtol=1e-3)
    _, held = trainer.split()
    prompts = trainer.val_prompts(held)
    assert trainer.estimate_tau(prompts) >= result.tau - 0.5  # the identity convolutions: DFlash 1's blocks
    out = Path(trainer.run().out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["dflash_config"]["selector_top_k"] == 8
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        shapes = {n: list(f.get_slice(n).get_shape()) for n in ("layers.0.attention_conv.base_kernel",
                  "layers.0.attention_conv.kernel_projection.weight", "candidate_selector.hidden_projection.weight")}
    # every size vLLM, llama.cpp's converter and z-lab's loader index, equal to the tensors' (issue 44)
    sizes, hidden = cfg["dflash_config"], cfg["hidden_size"]
    assert shapes["layers.0.attention_conv.base_kernel"] == [2, sizes["conv_kernel_size"], hidden]
    groups = hidden // sizes["conv_group_size"]
    assert shapes["layers.0.attention_conv.kernel_projection.weight"] == [2 * sizes["conv_kernel_size"] * groups, hidden]
    assert shapes["candidate_selector.hidden_projection.weight"] == [sizes["selector_rank"], hidden]
    assert sizes["block_size"] == cfg["block_size"]
    assert {"candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
            "layers.0.attention_conv.base_kernel", "layers.1.mlp_conv.kernel_projection.weight"} <= names
    target, _ = counting
    engines = ["cuda"] + (["mlx"] if importlib.util.find_spec("mlx_lm") else [])
    for name in engines:
        engine = engine_for(name, target, out)
        ids = engine.prepare(GenerationRequest(prompt="k", thinking=False))
        expected = transformers_greedy(target, ids, NEW)
        for block in (1, 8):
            summary = run(engine, prompt_ids=ids, max_new_tokens=NEW, temperature=0, block_size=block, stop_ids=[])[1]
            assert summary.token_ids == expected, (name, block)
        if name == "cuda":
            assert summary.mean_acceptance_length > 2  # a trained draft is accepted
    back = run_cli(cli_args(counting, tmp_path / "o", "--init-draft", str(out), "--block-size", "8"))
    assert back.exit_code == 2 and "--arch dflash2" in back.output, back.output
    assert load_engine(EngineConfig(target=str(target), draft=str(out), engine="cuda", device="cpu")).draft.dims


def test_given_responses_keep_the_thinking_a_template_drops_from_history():
    """The demo template (like Qwen3's) renders an assistant turn in the history without its <think> block;
    a given response is what the target writes, so its trace stays (training on the bare answers took a
    converged draft from tau 12 to 3 in 60 steps)."""
    from dflash_tui.engines.cuda.training.data import given_response_ids
    from dflash_tui.engines.prompting import load_tokenizer

    tok = load_tokenizer(Path(__file__).resolve().parent.parent / "profiles" / "demo" / "target")
    eos = [tok.convert_tokens_to_ids("<|im_end|>")]
    content = "<think>\nAdd 3 and 4.\nSo 3 + 4 = 7.\n</think>\n\n3 + 4 = 7."
    ids = given_response_ids(tok, [{"role": "user", "content": "What is 3 + 4?"}], content, True, eos)
    assert ids[-1] == eos[0] and tok.decode(ids[:-1]).strip() == content
    plain = given_response_ids(tok, [{"role": "user", "content": "Hi"}], "Hello.", False, eos)
    assert tok.decode(plain[:-1]).strip() == "Hello."


@pytest.mark.parametrize("failure", [
    RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0"),  # torch's, on ENOSPC
    OSError(28, "No space left on device"),
])
def test_a_full_disk_while_saving_the_state_is_one_sentence_and_leaves_no_tmp(counting, tmp_path, monkeypatch,
                                                                           failure):
    """Issue 34, class 15: a disk that fills while train_state.pt is saved was an unexpected RuntimeError
    ([enforce fail …]) with train_state.tmp left behind. The fake writes part of the file, then fails."""
    from dflash_tui.engines.errors import UserError

    def full_disk(obj, fh, *args, **kwargs):  # torch.save is given the open new file (engines/files.py)
        fh.write(b"PK\x03\x04 part of a zip")
        raise failure

    work = tmp_path / "work"
    trainer = Trainer(config(counting, tmp_path / "draft", work_dir=str(work)))
    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(UserError) as info:
        trainer.save_state(1, torch.optim.AdamW(trainer.draft.parameters()), [])
    message = str(info.value)
    assert f"--work-dir {work}" in message and "train_state.pt" in message and "\n" not in message, message
    assert not [p for p in work.iterdir() if p.name.endswith(".tmp")] and not (work / "train_state.pt").exists()


@pytest.mark.parametrize("which", ["draft", "empty"])
def test_a_target_without_a_token_embedding_is_refused_before_loading(counting, tmp_path, which):
    """A DFlash draft (or any folder whose weights hold no *embed_tokens.weight) named as the target: one
    sentence before transformers loads it, fills the gap with random weights and prints its table."""
    from safetensors.torch import save_file

    target = tmp_path / which
    if which == "draft":
        target = Path(__file__).resolve().parent.parent / "profiles" / "demo" / "draft"
    else:  # a target's config beside weights that hold no embedding
        target.mkdir()
        source = counting[0]
        (target / "config.json").write_text((Path(source) / "config.json").read_text())
        save_file({"model.norm.weight": torch.ones(4)}, str(target / "model.safetensors"))
    result = run_cli(["--target", str(target), "--data", str(counting[1]), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "no token embedding" in result.output, result.output
    assert ("pass it as the draft" in result.output) == (which == "draft")
    assert "LOAD REPORT" not in result.output and "MISSING" not in result.output
