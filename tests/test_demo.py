"""The README's main command runs end to end (scaled down so that it takes seconds)."""

import json

import pytest

from helpers import load_script

demo = load_script("training/demo.py")


def test_demo_trains_saves_reloads_and_translates(tmp_path, capsys):
    output_dir = tmp_path / "demo"
    flags = ["--output-dir", str(output_dir), "--train-size", "200", "--test-size", "8", "--max-tokens", "256"]
    flags += ["--warmup-steps", "5", "--disable_tqdm", "true", "--save_strategy", "steps", "--save_steps", "20"]
    demo.main([*flags, "--max-steps", "20"])
    printed = capsys.readouterr().out
    saved = {p.name for p in output_dir.iterdir()}
    # the Hub format: weights, config with auto_map, generation settings, tokenizer, remote code
    assert {
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "modeling_vanilla_transformer.py",
    } <= saved
    assert "reloaded with the Auto classes: VanillaTransformerForConditionalGeneration" in printed
    assert "held-out exact match:" in printed and "character BLEU" in printed
    assert printed.count(" -> ") == 8  # one beam-search translation per held-out number
    # a mistyped flag is refused before anything of the earlier run goes
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--output-dir", str(output_dir), "--max_tokns", "3"])
    assert exit_info.value.code == 2 and "(did you mean --max_tokens?)" in capsys.readouterr().err
    assert (output_dir / "checkpoint-20").is_dir()
    # so is a validation file that is not there, beside the generated task's own training data
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--output-dir", str(output_dir), "--validation_file", str(tmp_path / "val.tsv")])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--validation_file" in error and "does not exist" in error, error
    assert (output_dir / "checkpoint-20").is_dir()
    # and any flag train's own checks refuse (all that need only the flags, as table3 checks its rows)
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--output-dir", str(output_dir), "--max_source_length", "2000"])  # past the model's positions
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--max_source_length 2000 is more than the model's 1024 positions" in error, (
        error
    )
    assert (output_dir / "checkpoint-20").is_dir()
    # resuming continues the earlier run in its folder (what a stopped demo says to do)
    demo.main([*flags, "--max-steps", "22", "--resume_from_checkpoint", "last"])  # the same command, resuming
    printed = capsys.readouterr().out
    assert (
        "replacing" not in printed and json.loads((output_dir / "trainer_state.json").read_text())["global_step"] == 22
    )
    # run again: the earlier demo's run is replaced (train.py refuses to train over any other folder's model)
    again = ["--output-dir", str(output_dir), "--train-size", "50", "--test-size", "2", "--max-steps", "2"]
    demo.main([*again, "--resume_from_checkpoint", "false"])  # not a resume: train's own reading of the value
    printed = capsys.readouterr().out
    assert f"replacing the earlier demo's run in {output_dir}" in printed and printed.count(" -> ") == 2
    assert not (output_dir / "checkpoint-20").exists()


def test_demo_trains_on_the_users_files_when_given(tmp_path, capsys):
    source, target = tmp_path / "my.en", tmp_path / "my.de"
    source.write_text("".join(f"number {i}\n" for i in range(60)))
    target.write_text("".join(f"Nummer {i}\n" for i in range(60)))
    output_dir = tmp_path / "mine"
    demo.main(
        [
            "--output-dir",
            str(output_dir),
            "--max-steps",
            "5",
            "--warmup-steps",
            "2",
            "--train-source-file",  # either spelling, as train takes it
            str(source),
            "--train-target-file",
            str(target),
            "--validation_source_file",
            str(source),
            "--validation_target_file",
            str(target),
            "--max_eval_samples",
            "4",
            "--disable_tqdm",
            "true",
            "--tokenizer_vocab_size",
            "300",
        ]
    )
    printed = capsys.readouterr().out
    assert not (output_dir / "data").exists()  # no generated task
    assert "held-out BLEU:" in printed and printed.count(" -> ") == 4
    # a file that is not there is refused before the earlier demo's run is replaced (it was replaced, then refused)
    missing = tmp_path / "my.fr"
    with pytest.raises(SystemExit) as exit_info:
        demo.main(
            ["--output-dir", str(output_dir), "--train_source_file", str(source), "--train_target_file", str(missing)]
        )
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"--train_target_file '{missing}' does not exist" in error, error
    assert (output_dir / "model.safetensors").is_file()


def test_a_resume_into_a_new_folder_marks_it_as_the_demos(tmp_path):
    """A resume kept any folder as it was, unmarked: a later demo could then neither replace it nor train there."""
    demo.start_afresh(tmp_path / "new", replace=False)
    assert (tmp_path / "new" / demo.DEMO_MARK).is_file()
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("not the demo's")
    demo.start_afresh(tmp_path / "theirs")
    assert sorted(p.name for p in (tmp_path / "theirs").iterdir()) == ["notes.txt"]  # never marked, never replaced


def test_trains_warnings_are_said_once(tmp_path, monkeypatch, caplog):
    """The demo parses train's flags first (to refuse a mistyped one before replacing anything), and its warnings
    were then logged twice: once by that parse, once by train's own."""
    seen = []

    def train(argv, **kwargs):  # train's command, stopped after its flags: no model to report on
        seen.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(demo.run, "main", train)
    with caplog.at_level("WARNING"), pytest.raises(SystemExit):
        demo.main(["--output-dir", str(tmp_path / "demo"), "--tokenizer_name_or_path", str(tmp_path)])
    assert seen and caplog.records == []  # train's parse (stubbed here) says it
    demo.run.parse_arguments(seen[0])
    assert "--tokenizer_vocab_size ignored" in caplog.text, caplog.text


def test_quiet_logs_gives_back_the_level_disabled_before():
    import logging

    logging.disable(logging.INFO)  # a notebook's or a wrapping script's own
    try:
        with demo.quiet_logs():
            assert logging.root.manager.disable == logging.WARNING
        assert logging.root.manager.disable == logging.INFO
        logging.disable(logging.CRITICAL)
        with demo.quiet_logs():  # never less quiet than before
            assert logging.root.manager.disable == logging.CRITICAL
        assert logging.root.manager.disable == logging.CRITICAL
    finally:
        logging.disable(logging.NOTSET)
