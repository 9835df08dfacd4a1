"""The grading machinery: a registry of exercises and their cases, `run`, `check` and the score.

A case is a function that takes the implementation and raises `Failure` with a message that says
what it gave, what it expected and what came back. The learner's code is called through `call`
so that a crash is reported the same way.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

from exercises.grading.time_limit import TimeLimitExceeded, within

PACKAGE = "exercises"  # where the learner's implementations live
_GRADING_DIR = str(Path(__file__).parent)
_EXERCISES_DIR = str(Path(__file__).parents[1])
_NOT_THEIRS = (str(Path(__file__).parents[2] / "minillm"), sys.prefix, sys.base_prefix)  # engine, libraries


class Failure(Exception):
    """A case's verdict on wrong behaviour (kept apart from AssertionErrors in the learner's code)."""

    def __init__(self, given: str, expected: str, got: str):
        super().__init__(f"{given}: expected {expected}, got {got}")
        self.expected, self.got = expected, got


@dataclass
class Case:
    title: str  # the rule the case checks, e.g. "allocate takes blocks from the front"
    fn: Callable[[Any], None]


@dataclass
class Exercise:
    name: str  # "ch04.allocate"
    module: str  # its file in exercises/ and solutions/, e.g. "ch04_block_allocator"
    attr: str  # the function or class the learner writes
    cases: list[Case] = field(default_factory=list)
    time_limit_s: float = 10.0  # per call of the learner's code; the solution takes a small fraction of it

    @property
    def case_limit_s(self) -> float:
        """A whole case, the grader's own work included (running an engine to compare with): a net
        for code the case calls without `call`, generous for a machine that is very busy."""
        return max(120.0, 10 * self.time_limit_s)

    @property
    def chapter(self) -> str:
        return self.name.split(".")[0]

    def case(self, fn: Callable[[Any], None]) -> Callable[[Any], None]:
        """Decorator: register `fn` as a case. The rule it checks is its docstring's first line, or
        else its name with spaces."""
        title = (fn.__doc__ or "").strip().splitlines()[0].rstrip(".") if fn.__doc__ else fn.__name__.replace("_", " ")
        self.cases.append(Case(title, fn))
        return fn


EXERCISES: dict[str, Exercise] = {}


def exercise(name: str, module: str, attr: str, time_limit_s: float = 10.0) -> Exercise:
    """Declare exercise `name`, implemented as `attr` in `exercises/<module>.py`; each call of the
    learner's code may run `time_limit_s` seconds."""
    EXERCISES[name] = Exercise(name, module, attr, time_limit_s=time_limit_s)
    return EXERCISES[name]


# ----------------------------------------------------------------------------- helpers for cases



def listed(values: Any) -> str:
    """A tensor's (nested) list with each number in at most 6 digits: 1.27, not 1.2699999809265137."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, list):
        return "[" + ", ".join(map(listed, values)) + "]"
    return f"{values:.6g}" if isinstance(values, float) else str(values)


def fail(given: str, expected: object, got: object) -> NoReturn:
    raise Failure(given, str(expected), str(got))


def expect(ok: bool, given: str, expected: object, got: object) -> None:
    if not ok:
        fail(given, expected, got)


CALL_LIMIT_S: contextvars.ContextVar[float] = contextvars.ContextVar("CALL_LIMIT_S", default=10.0)  # set by run()


def call(given: str, expected: object, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args)`: the learner's code, within the exercise's time limit. A crash fails the case,
    naming the input and the expected."""
    try:
        return within(CALL_LIMIT_S.get(), lambda: fn(*args, **kwargs))
    except (NotImplementedError, Failure):
        raise
    except Exception as err:
        fail(given, expected, crash(err))


def expect_raises(error: type[Exception], given: str, fn: Callable, *args: Any) -> None:
    """`fn(*args)` must raise `error`."""
    try:
        fn(*args)
    except error:
        return
    except (NotImplementedError, Failure):
        raise
    except Exception as err:
        fail(given, error.__name__, crash(err))
    fail(given, error.__name__, "no error")


class Story:
    """An object of the learner's, and the story of the calls made on it: the "given" of every message.

        Story("BlockAllocator", cls, num_blocks=5).do([0, 1], "allocate", 2)
        given: BlockAllocator(num_blocks=5), allocate(2)   expected: it to return [0, 1]
    """

    def __init__(self, name: str, cls: Any, *args: Any, **kwargs: Any):
        shown = [*map(repr, args), *(f"{key}={value!r}" for key, value in kwargs.items())]
        self.story = f"{name}({', '.join(shown)})"
        self.impl = call(self.story, f"a {name}", cls, *args, **kwargs)

    def do(self, want: Any, method: str, *args: Any, why: str | None = None) -> Any:
        """Call `method(*args)`; it must return the list `want` (anything, when want is None), for the
        reason `why` (said in the FAIL)."""
        self.story += f", {method}({', '.join(map(repr, args))})"
        expected = "no error" if want is None else f"it to return {want!r}" + (f" ({why})" if why else "")
        got = call(self.story, expected, lambda: getattr(self.impl, method)(*args))
        if want is not None:
            expect(isinstance(got, list) and got == want, self.story, expected, repr(got))
        return got

    def fails(self, error: type[Exception], method: str, *args: Any) -> None:
        """Call `method(*args)`; it must raise `error`."""
        self.story += f", {method}({', '.join(map(repr, args))})"
        expect_raises(error, self.story, lambda: getattr(self.impl, method)(*args))
        self.story += f" → {error.__name__}"  # what later calls of the story follow

    def expect_state(self, why: str, **want: list | set) -> None:
        """Each named attribute, read as a list (or a set, where `want` gives a set), must equal `want`'s."""
        got = {name: self._read(name, set if isinstance(value, set) else list) for name, value in want.items()}
        show = lambda state: ", ".join(f"{n} {sorted(v) if isinstance(v, set) else v}" for n, v in state.items())  # noqa: E731
        expect(got == want, f"after {self.story}", f"{show(want)} ({why})", show(got))

    def _read(self, name: str, kind: type) -> list | set:
        return call(f"after {self.story}", f"an attribute {name}", lambda: kind(getattr(self.impl, name)))


def crash(err: BaseException) -> str:
    """'ValueError: ... (line 12 of my_file.py)', at the deepest line that is the learner's. A syntax
    error names the line it is on, not the import machinery that found it."""
    if isinstance(err, SyntaxError) and err.filename and err.lineno:
        text = f": {err.text.strip()!r}" if err.text and err.text.strip() else ""
        return f"{type(err).__name__}: {err.msg} (line {err.lineno} of {err.filename}{text})"
    where = learners_line(err)
    return f"{type(err).__name__}: {err}" + (f" ({where})" if where else "")


def learners_line(err: BaseException, theirs_only: bool = False) -> str | None:
    """'line 12 of my_file.py': where `err` was raised, at the deepest line that is the learner's
    (else the deepest real line, unless `theirs_only`)."""
    frames = traceback.extract_tb(err.__traceback__)
    # code generated at run time ("<string>": a dataclass's __init__) is nobody's line to open
    real = [f for f in frames if not f.filename.startswith("<") or f.filename.startswith("<ipython-input")]
    theirs = [f for f in real if not f.filename.startswith(_GRADING_DIR)
              and (f.filename.startswith(_EXERCISES_DIR) or not f.filename.startswith(_NOT_THEIRS))]
    candidates = theirs if theirs_only else (theirs or real or frames)
    where = candidates[-1] if candidates else None
    return f"line {where.lineno} of {where.filename}" if where else None


# ----------------------------------------------------------------------------- running


@dataclass
class Result:
    case: str
    status: str  # "pass", "fail", "timed out" or "not started" (the case met a NotImplementedError)
    message: str = ""  # what was given, what was expected, what came back
    expected: str = ""
    got: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def line(self) -> str:
        return f"PASS  {self.case}" if self.passed else f"FAIL  {self.case}: {self.message}"


RUN_MEMO: dict[object, object] = {}  # what the cases of one run may share (a costly call's result); emptied per run


def run(name: str, impl: Any) -> list[Result]:
    """Every case of exercise `name` on `impl`, graded as given: each call of the learner's code
    within the exercise's time limit, each whole case within `case_limit_s`. After a case runs out of
    time the later ones are not run (each would likely wait as long)."""
    RUN_MEMO.clear()
    ex = _exercise(name)
    results: list[Result] = []
    for case in ex.cases:
        if any(r.status == "timed out" for r in results):
            results.append(Result(case.title, "fail", "not run: an earlier case ran out of time",
                                  "a result", "not run"))
            continue
        limit = CALL_LIMIT_S.set(ex.time_limit_s)
        try:
            within(ex.case_limit_s, lambda case=case: case.fn(impl))
            results.append(Result(case.title, "pass"))
        except TimeLimitExceeded as err:
            results.append(_timed_out(case, ex, err))
        except NotImplementedError as err:
            results.append(Result(case.title, "not started", f"not implemented yet (NotImplementedError: {err})"))
        except Failure as err:
            results.append(Result(case.title, "fail", str(err), err.expected, err.got))
        except Exception as err:  # a step the case did not wrap in call(): still say what happened
            results.append(Result(case.title, "fail", f"expected no error, got {crash(err)}"))
        finally:
            CALL_LIMIT_S.reset(limit)
    return results


def _timed_out(case: Case, ex: Exercise, err: TimeLimitExceeded) -> Result:
    """A case past its time: the learner's code still running (where), or the grader's own work."""
    where = learners_line(err, theirs_only=True)
    if where is not None:
        got = f"no answer within {ex.time_limit_s:g} s, stopped at {where} (an endless loop?)"
        return Result(case.title, "timed out", f"expected an answer, got {got}", "an answer", got)
    got = (f"the grader's own work (not your code) did not finish within {ex.case_limit_s:g} s: the machine "
           "may be very busy; run the check again")
    return Result(case.title, "timed out", f"expected a verdict, got {got}", "a verdict", got)


def not_started(results: list[Result]) -> bool:
    return all(r.status == "not started" for r in results)


def load(name: str, package: str = PACKAGE) -> Any:
    """Exercise `name`'s function or class in `package`, re-read from its file now (its top-level
    code within the exercise's time limit)."""
    ex = _exercise(name)
    try:
        module = within(ex.time_limit_s, lambda: _fresh_module(f"{package}.{ex.module}"))
    except TimeLimitExceeded as err:
        raise TimeoutError(f"importing it took more than {ex.time_limit_s:g} s, stopped at "
                           f"{learners_line(err) or 'its top-level code'}") from None
    return getattr(module, ex.attr)


def check(name: str, impl: Any = None, *, package: str = PACKAGE) -> None:
    """Grade exercise `name` and print PASS/FAIL per case.

    Without `impl`, grades your function or class in exercises/, re-read from its file (an edit
    counts on the next check, no kernel restart). An `impl` imported from exercises/ is re-read
    too; one defined in the notebook is graded as given.
    """
    ex = _exercise(name)
    try:
        impl = load(name, package) if impl is None else _refresh(impl, package)
    except Exception as err:  # the learner's file does not import
        print(f"FAIL  {package}/{ex.module}.py does not import: expected no error, got {crash(err)}")
        print(f"{name}: 0/{len(ex.cases)} passed")
        return
    results = run(name, impl)
    if not_started(results):
        print(f"{name}: not started (the code still raises NotImplementedError)")
        return
    for result in results:
        print(result.line())
    passed = sum(r.passed for r in results)
    print(f"{name}: {passed}/{len(results)} passed" + (" — well done!" if passed == len(results) else ""))


def _exercise(name: str) -> Exercise:
    if name not in EXERCISES:
        raise KeyError(f"unknown exercise {name!r}; known: {sorted(EXERCISES)}")
    return EXERCISES[name]


def _refresh(impl: Any, package: str) -> Any:
    """`impl` itself, or, if it comes from one of `package`'s exercise files, the same name re-read."""
    module = getattr(impl, "__module__", None)
    if module not in {f"{package}.{ex.module}" for ex in EXERCISES.values()}:
        return impl
    fresh: Any = _fresh_module(module)
    for part in impl.__qualname__.split("."):
        fresh = getattr(fresh, part, None)
    return impl if fresh is None else fresh


def _fresh_module(name: str) -> ModuleType:
    """importlib.reload from the source file (its .pyc goes first: an edit within the same second
    as the last import would not be seen through it)."""
    module = importlib.import_module(name)
    if module.__spec__ is not None and module.__spec__.origin:
        with contextlib.suppress(OSError, NotImplementedError, ValueError):
            os.remove(importlib.util.cache_from_source(module.__spec__.origin))
    return importlib.reload(module)


# ----------------------------------------------------------------------------- the score


@dataclass
class Row:
    exercise: str
    passed: int
    total: int
    note: str  # the first failure (shortened), "not started", or "all passed"


def score(package: str = PACKAGE) -> dict[str, list[Row]]:
    """Each chapter's rows: every exercise of `package` graded from its file."""
    chapters: dict[str, list[Row]] = {}
    for ex in EXERCISES.values():
        try:
            results = run(ex.name, load(ex.name, package))
        except Exception as err:
            row = Row(ex.name, 0, len(ex.cases), _clip(f"{package}/{ex.module}.py does not import: {crash(err)}"))
        else:
            passed = sum(r.passed for r in results)
            failed = next((r for r in results if not r.passed), None)
            note = ("all passed" if failed is None else "not started" if not_started(results)
                    else _note(failed))
            row = Row(ex.name, passed, len(results), note)
        chapters.setdefault(ex.chapter, []).append(row)
    return chapters


def format_score(chapters: dict[str, list[Row]]) -> str:
    """One table per chapter: exercise, passed/total, the first failure."""
    lines = []
    width = max(len(r.exercise) for rows in chapters.values() for r in rows)
    for chapter, rows in chapters.items():
        lines += [f"Chapter {int(chapter[2:])}", f"  {'exercise':<{width}}  passed  first failure"]
        lines += [f"  {r.exercise:<{width}}  {f'{r.passed}/{r.total}':>6}  {r.note}" for r in rows]
        lines.append("")
    done = sum(r.passed == r.total for rows in chapters.values() for r in rows)
    lines.append(f"{done}/{sum(map(len, chapters.values()))} exercises complete")
    return "\n".join(lines)


def _note(failed: Result, width: int = 100) -> str:
    """The first failure in `width` characters: the case, then (cut short) the expected and the got."""
    note = _clip(f"{failed.case}: {failed.message}", 10**6)
    if len(note) > width and failed.expected:
        note = f"{failed.case}: expected {_clip(failed.expected, 35)}, got {_clip(failed.got, 25)}"
    return _clip(note, width)


def _clip(text: str, width: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
