"""One JSONL reader (toolgym.jsonl) behind every JSONL loader: the same errors, naming file and line."""

import pytest

from toolgym.envs.free_qa.env import load_questions as free_qa_questions
from toolgym.envs.search.corpus import load_questions as search_questions
from toolgym.errors import ConfigError
from toolgym.jsonl import read_jsonl
from toolgym.rewards.judge_calibration import load_labelled


def test_read_jsonl_skips_blank_lines_and_numbers_from_one(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n  \n[2]\n"x"\n')
    assert read_jsonl(path) == [(1, {"a": 1}), (4, [2]), (5, "x")]


def test_read_jsonl_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{oops\n')
    with pytest.raises(ConfigError, match=r"rows\.jsonl:3: not JSON"):
        read_jsonl(path)
    with pytest.raises(ConfigError, match=r"cannot read the questions file .*missing"):
        read_jsonl(tmp_path / "missing.jsonl", "questions file")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"a": "\xe9"}\n')
    with pytest.raises(ConfigError, match="cannot read"):
        read_jsonl(tmp_path / "latin1.jsonl")


GOOD = {
    "free_qa": '{"question": "q", "reference": "r"}',
    "search": '{"question": "q", "answer": "r"}',
    "labelled": '{"question": "q", "answer": "a", "label": 1}',
}
LOADERS = {"free_qa": free_qa_questions, "search": search_questions, "labelled": load_labelled}


@pytest.mark.parametrize("name", sorted(LOADERS))
@pytest.mark.parametrize("bad", ["{not json", "[1, 2"])
def test_every_loader_names_the_bad_line(tmp_path, name, bad):
    path = tmp_path / "data.jsonl"
    path.write_text(f"{GOOD[name]}\n\n{bad}\n")
    with pytest.raises(ConfigError, match=r"data\.jsonl:3: not JSON"):
        LOADERS[name](path)


@pytest.mark.parametrize("name", ["free_qa", "labelled"])
def test_a_row_of_the_wrong_shape_is_a_config_error_with_its_line(tmp_path, name):
    path = tmp_path / "data.jsonl"
    path.write_text(f"{GOOD[name]}\n5\n")
    with pytest.raises(ConfigError, match=r"data\.jsonl:2: "):
        LOADERS[name](path)
