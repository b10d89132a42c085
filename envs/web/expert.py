"""The family's scripted expert: a solver per MiniWoB++ task. Solvers read the same element list the model
sees and answer one text action at a time, so they prove the observation and the action plumbing end to
end.

A solver is ``solve(snapshot, memory) -> action | None`` (None: it is stuck); ``memory`` is a dict kept for
the episode (multi-step tasks note what they already did there).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

Solver = Callable[[Any, dict[str, Any]], "str | None"]
SOLVERS: dict[str, Solver] = {}
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")  # fmt: skip


def solver(*tasks: str) -> Callable[[Solver], Solver]:
    def add(fn: Solver) -> Solver:
        for task in tasks:
            SOLVERS[task] = fn
        return fn

    return add


def _quoted(utterance: str) -> str:
    found = re.search(r'"(.*?)"', utterance)
    return found.group(1) if found else ""


def _find(snapshot: Any, role: str | tuple[str, ...], text: str | None = None) -> list[dict[str, Any]]:
    roles = (role,) if isinstance(role, str) else role
    return [e for e in snapshot.elements if e["role"] in roles and (text is None or e.get("text") == text)]


def _click(element: dict[str, Any]) -> str:
    return f"click({element['id']})"


def _type(element: dict[str, Any], text: str) -> str:
    return f"type({element['id']}, {json.dumps(text)})"


def _submit(snapshot: Any, label: str = "Submit") -> str | None:
    buttons = [e for e in _find(snapshot, "button") if e.get("text", "").lower() == label.lower()]
    return _click(buttons[0]) if buttons else None


def _fill_then_submit(
    snapshot: Any, fields: list[dict[str, Any]], texts: list[str], label: str = "Submit"
) -> str | None:
    for field, text in zip(fields, texts, strict=False):
        if field.get("value") != text:
            return _type(field, text)
    return _submit(snapshot, label)


@solver("click-button")
def click_button(snapshot: Any, memory: dict[str, Any]) -> str | None:
    found = _find(snapshot, "button", _quoted(snapshot.utterance))
    return _click(found[0]) if found else None


@solver("click-link")
def click_link(snapshot: Any, memory: dict[str, Any]) -> str | None:
    found = _find(snapshot, ("text", "link"), _quoted(snapshot.utterance))
    return _click(found[-1]) if found else None


@solver("click-button-sequence")
def click_button_sequence(snapshot: Any, memory: dict[str, Any]) -> str | None:
    label = "TWO" if memory.get("one") else "ONE"
    memory["one"] = True
    found = _find(snapshot, "button", label)
    return _click(found[0]) if found else None


@solver("click-dialog", "click-dialog-2")
def click_dialog(snapshot: Any, memory: dict[str, Any]) -> str | None:
    want = _quoted(snapshot.utterance)
    if want.lower() == "x":
        found = _find(snapshot, "button", "Close")
    else:
        found = [e for e in _find(snapshot, "button") if e.get("text") == want]
    return _click(found[0]) if found else None


@solver("click-checkboxes", "click-checkboxes-large", "click-checkboxes-transfer")
def click_checkboxes(snapshot: Any, memory: dict[str, Any]) -> str | None:
    found = re.match(r"Select (.*) and click Submit", snapshot.utterance)
    if not found:
        return None
    words = found.group(1)
    wanted = set() if words == "nothing" else {w.strip() for w in re.split(r",\s*", words) if w.strip()}
    for box in _find(snapshot, "checkbox"):
        if (box.get("text") in wanted) != bool(box.get("checked")):
            return _click(box)
    return _submit(snapshot)


@solver("click-option")
def click_option(snapshot: Any, memory: dict[str, Any]) -> str | None:
    found = re.match(r"Select (.*) and click Submit", snapshot.utterance)
    if not found:
        return None
    radios = _find(snapshot, "radio", found.group(1).strip())
    if radios and not radios[0].get("checked"):
        return _click(radios[0])
    return _submit(snapshot)


@solver("choose-list")
def choose_list(snapshot: Any, memory: dict[str, Any]) -> str | None:
    found = re.match(r"Select (.*) from the list and click Submit", snapshot.utterance)
    lists = _find(snapshot, "combobox")
    if not found or not lists:
        return None
    option = found.group(1).strip()
    if lists[0].get("value") != option:
        return f"select({lists[0]['id']}, {json.dumps(option)})"
    return _submit(snapshot)


@solver("enter-text")
def enter_text(snapshot: Any, memory: dict[str, Any]) -> str | None:
    return _fill_then_submit(snapshot, _find(snapshot, "textbox")[:1], [_quoted(snapshot.utterance)])


@solver("enter-text-2")
def enter_text_2(snapshot: Any, memory: dict[str, Any]) -> str | None:
    word = _quoted(snapshot.utterance)
    word = word.lower() if "lower case" in snapshot.utterance else word.upper()
    return _fill_then_submit(snapshot, _find(snapshot, "textbox")[:1], [word])


@solver("enter-password")
def enter_password(snapshot: Any, memory: dict[str, Any]) -> str | None:
    secret = _quoted(snapshot.utterance)
    return _fill_then_submit(snapshot, _find(snapshot, "password"), [secret, secret])


@solver("login-user")
def login_user(snapshot: Any, memory: dict[str, Any]) -> str | None:
    found = re.findall(r'"(.*?)"', snapshot.utterance)
    if len(found) < 2:
        return None
    fields = _find(snapshot, "textbox")[:1] + _find(snapshot, "password")[:1]
    return _fill_then_submit(snapshot, fields, found[:2], label="Login")


@solver("focus-text")
def focus_text(snapshot: Any, memory: dict[str, Any]) -> str | None:
    boxes = _find(snapshot, "textbox")
    return _click(boxes[0]) if boxes else None


@solver("enter-date")
def enter_date(snapshot: Any, memory: dict[str, Any]) -> str | None:
    found = re.search(r"(\d\d)/(\d\d)/(\d{4})", snapshot.utterance)
    fields = _find(snapshot, "date")
    if not found or not fields:
        return None
    month, day, year = found.groups()
    return _fill_then_submit(snapshot, fields[:1], [f"{year}-{month}-{day}"])


@solver("enter-time")
def enter_time(snapshot: Any, memory: dict[str, Any]) -> str | None:
    found = re.search(r"(\d{1,2}):(\d\d) ?(AM|PM)", snapshot.utterance)
    fields = _find(snapshot, "time")
    if not found or not fields:
        return None
    hour, minute, half = int(found.group(1)), found.group(2), found.group(3)
    hour = hour % 12 + (12 if half == "PM" else 0)
    return _fill_then_submit(snapshot, fields[:1], [f"{hour:02d}:{minute}"])


@solver("use-spinner")
def use_spinner(snapshot: Any, memory: dict[str, Any]) -> str | None:
    found = re.search(r"Select (-?\d+)", snapshot.utterance)
    return _fill_then_submit(snapshot, _find(snapshot, "textbox")[:1], [found.group(1)]) if found else None


@solver("click-tab")
def click_tab(snapshot: Any, memory: dict[str, Any]) -> str | None:
    found = re.search(r"Click on (Tab #\d+)", snapshot.utterance)
    links = _find(snapshot, "link", found.group(1)) if found else []
    return _click(links[0]) if links else None


@solver("click-tab-2", "click-tab-2-easy", "click-tab-2-medium")
def click_tab_2(snapshot: Any, memory: dict[str, Any]) -> str | None:
    target = _quoted(snapshot.utterance)
    hits = _find(snapshot, "text", target)
    if hits and memory.get("tab"):
        return _click(hits[-1])
    tabs = [e for e in _find(snapshot, "link") if e.get("text", "").startswith("Tab #")]
    seen = memory.setdefault("seen", [])
    for tab in tabs:
        if tab["text"] not in seen:
            seen.append(tab["text"])
            memory["tab"] = True
            return _click(tab)
    return _click(hits[-1]) if hits else None


@solver("click-collapsible", "click-collapsible-nodelay")
def click_collapsible(snapshot: Any, memory: dict[str, Any]) -> str | None:
    if not memory.get("opened"):
        headers = [e for e in _find(snapshot, "tab") if e.get("text")]
        if headers:
            memory["opened"] = True
            return _click(headers[0])
    return _submit(snapshot)


@solver("choose-date-nodelay", "choose-date", "choose-date-easy", "choose-date-medium")
def choose_date(snapshot: Any, memory: dict[str, Any]) -> str | None:
    found = re.search(r"(\d\d)/(\d\d)/(\d{4})", snapshot.utterance)
    if not found:
        return None
    month, day, year = int(found.group(1)), int(found.group(2)), int(found.group(3))
    field = _find(snapshot, "textbox")[:1]
    if field and field[0].get("value") == found.group(0):
        return _submit(snapshot)
    texts = [e.get("text", "") for e in snapshot.elements if e["role"] == "text"]
    shown_month = next((MONTHS.index(t) + 1 for t in texts if t in MONTHS), None)
    shown_year = next((int(t) for t in texts if re.fullmatch(r"\d{4}", t)), None)
    if shown_month is None or shown_year is None:
        return _click(field[0]) if field else None  # open the calendar
    if (shown_year, shown_month) > (year, month):
        links = _find(snapshot, "link", "Prev")
        return _click(links[0]) if links else None
    if (shown_year, shown_month) < (year, month):
        links = _find(snapshot, "link", "Next")
        return _click(links[0]) if links else None
    days = _find(snapshot, "link", str(day))
    return _click(days[0]) if days else None
