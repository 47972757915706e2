"""The job log as people read it (jobs/logtext.py): colours stripped, VOLT_EVENT lines as sentences, one
readable line per stored line, so a page of the stored text renders on its own."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from jobs.logtext import readable
from jobs.workloads import volt_ckpt

RAY_LINE = "\x1b[36m(TrainRank pid=4242, ip=127.0.0.2)\x1b[0m \x1b[1;33mwarning:\x1b[0m slow step\n"


def test_colour_codes_are_stripped():
    assert readable(RAY_LINE) == "(TrainRank pid=4242, ip=127.0.0.2) warning: slow step\n"
    assert readable("\x1b]0;title\x07plain \x1b[2Kline\x1b(B\n") == "plain line\n"
    assert readable("bell\x07 and\x08 nul\x00\n") == "bell and nul\n"


def test_events_read_as_steps_losses_and_checkpoints():
    lines = [
        volt_ckpt.event_line("step", step=120, loss=0.43214, time=1.7e9),
        volt_ckpt.event_line("checkpoint", step=120, path="/s/step-00000120", shards=3, bytes=13_107_200),
        volt_ckpt.event_line("checkpoint", step=130, path="/s/step-00000130"),
        volt_ckpt.event_line("busbw", **volt_ckpt.busbw_fields(121, 4_000_000, 0.002, 2)),
        volt_ckpt.event_line("resumed", step=40, path="/s/step-00000040"),
        volt_ckpt.event_line("done", step=200, params_sha256="ab12"),
        volt_ckpt.event_line("epoch", epoch=3, lr=0.0001),
    ]
    assert readable("\n".join(lines) + "\n").splitlines() == [
        "step 120  loss 0.4321",
        "checkpoint step 120 saved (3 shards, 12.5 MB)",
        "checkpoint step 130 saved",
        "step 121  all-reduce busbw 2.000 GB/s (algbw 2.000 GB/s, 2 ranks)",
        "resumed from the checkpoint of step 40",
        "done at step 200  params sha256 ab12",
        "epoch  epoch 3  lr 1.000e-04",
    ]


def test_an_event_after_a_log_prefix_keeps_the_prefix_and_a_broken_one_stays_as_it_is():
    prefixed = "\x1b[36m(driver)\x1b[0m " + volt_ckpt.event_line("step", step=1, loss=2.0) + "\n"
    assert readable(prefixed) == "(driver) step 1  loss 2.0000\n"
    assert readable('VOLT_EVENT {"kind": "step", "ste\n') == 'VOLT_EVENT {"kind": "step", "ste\n'


def test_a_progress_bar_redrawn_with_carriage_returns_shows_its_last_state():
    assert readable(" 10%|#   |\r 50%|#### |\r100%|#####|\r\nnext\n") == "100%|#####|\nnext\n"


PIECES = ["a", "é", "\n", "\r", "\x1b", "[", "3", "m", " ", "VOLT_EVENT ", '{"kind": "step", "step": 1}']


@given(st.lists(st.sampled_from(PIECES)).map("".join))
def test_one_readable_line_per_stored_line(text):
    assert readable(text).count("\n") == text.count("\n")
    # Rendering page by page at line ends is rendering the whole.
    cut = text.find("\n") + 1
    assert readable(text[:cut]) + readable(text[cut:]) == readable(text)
