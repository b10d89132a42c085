"""Terminal-v0's built-in tasks: files, text processing, git, small builds, Python packaging.

Each task's verifier is a Harbor ``tests/test.sh`` that runs ``tests/checks.sh`` (``set -e``: every line a
check) and writes 1 or 0 to ``/logs/verifier/reward.txt``. Each has a reference solution, one shell command
per step, which the scripted expert plays. Every task works offline (pip installs from local folders with
``--no-build-isolation``: the image carries setuptools and wheel).
"""

from __future__ import annotations

from toolgym.envs.terminal.harbor import TerminalTask

TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
cd /app
# Under toolgym the checks run with the agent's effective uid (TOOLGYM_AGENT_UID: its files' access) and
# another as their real one (TOOLGYM_CHECKS_UID; the next uid when unset), in a clean environment: the agent's programs they run cannot write the reward,
# no PATH, HOME or Python user site of the agent's applies, and, the real and effective uids differing, every
# process of the checks is non-dumpable: a program of the agent's cannot ptrace or write the memory of the
# checks' shell or commands (with one uid it could make them exit 0). Root writes the reward from their exit
# code. The checks go first when the container runs out of memory (oom_score_adj 1000, as the agent's shell):
# a memory hog of the agent's they run is killed, not the verifier. Elsewhere (Harbor: the agent was root)
# they run as root.
shell=(bash)
if [ -n "${TOOLGYM_AGENT_UID:-}" ]; then
  shell=(python3 -I -c 'import os, sys
u = int(sys.argv[1]); c = int(os.environ.get("TOOLGYM_CHECKS_UID") or u + 1)
open("/proc/self/oom_score_adj", "w").write("1000")
os.setgroups([]); os.setresgid(u, u, u); os.setresuid(c, u, u)
os.execvp(sys.argv[2], sys.argv[2:])' "$TOOLGYM_AGENT_UID"
         env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/nonexistent LANG=C.UTF-8 PYTHONNOUSERSITE=1
         PYTHONDONTWRITEBYTECODE=1 bash -p)
fi
if "${shell[@]}" /tests/checks.sh > /logs/verifier/checks.log 2>&1; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
# the user site of the agent's pip installs (it is not root): the packaging checks look there on purpose.
# Python turns the user site off when the real and effective uids differ (as in the checks): it is added by
# hand (``addsitedir`` reads its .pth files too, as for an editable install). USER_PY_C runs code, USER_PY a file.
_ADD_USER_SITE = "import runpy, site, sys; site.addsitedir(site.getusersitepackages()); "
USER_PY_C = f"env PYTHONUSERBASE=/home/agent/.local python3 -c '{_ADD_USER_SITE}exec(sys.argv[1])'"
USER_PY = (
    f"env PYTHONUSERBASE=/home/agent/.local python3 -c '{_ADD_USER_SITE}"
    'sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name="__main__")\''
)


def _task(
    name: str,
    category: str,
    instruction: str,
    checks: str,
    solution: list[str],
    extra_tests: dict[str, str] | None = None,
    **kw: object,
) -> TerminalTask:
    texts = {
        "test.sh": TEST_SH,
        "checks.sh": "set -e\ncd /app\n" + checks.strip() + "\n",
        **(extra_tests or {}),
    }
    tests = {rel: text.encode() for rel, text in texts.items()}
    return TerminalTask(
        name=name,
        category=category,
        instruction=instruction.strip(),
        tests=tests,
        solution=tuple(solution),
        **kw,  # type: ignore[arg-type]
    )


LOG = "\n".join(
    f"2024-05-0{d} 10:{m:02d}:00 {'ERROR' if (d * m) % 7 == 0 else 'INFO'} request {d * 100 + m} from "
    f"10.0.0.{(d * m) % 5 + 1}"
    for d in range(1, 4)
    for m in range(0, 20)
)
CSV = "name,city,amount\nada,paris,12\nbob,lyon,30\ncy,paris,7\ndee,nice,41\neve,lyon,10\n"
USERS = (
    '[{"name": "ada", "email": "ada@x.org", "active": true},'
    ' {"name": "bob", "email": "bob@x.org", "active": false},'
    ' {"name": "cy", "email": "cy@x.org", "active": true},'
    ' {"name": "al", "email": "al@x.org", "active": true}]\n'
)
PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"
"""

TASKS: list[TerminalTask] = [
    # ----- files ----------------------------------------------------------------------------------------
    _task(
        "sort-by-extension",
        "files",
        "The folder /app/inbox holds files of several kinds. Move each file into /app/sorted/<extension>/ "
        "(e.g. /app/sorted/txt/notes.txt), creating the folders; leave /app/inbox empty.",
        """test -z "$(ls -A inbox)"
test -f sorted/txt/notes.txt && test -f sorted/txt/todo.txt
test -f sorted/csv/data.csv && test -f sorted/log/app.log
test "$(cat sorted/txt/todo.txt)" = "buy milk"
""",
        [
            'cd /app && for f in inbox/*; do e=${f##*.}; mkdir -p sorted/$e; mv "$f" sorted/$e/; done',
            "ls -R /app/sorted",
        ],
        files={
            "inbox/notes.txt": "notes\n",
            "inbox/todo.txt": "buy milk\n",
            "inbox/data.csv": "a,b\n",
            "inbox/app.log": "ok\n",
        },
    ),
    _task(
        "list-large-files",
        "files",
        "Write the paths (relative to /app/data, one per line, sorted) of every file under /app/data larger "
        "than 1000 bytes to /app/large.txt.",
        'test "$(cat large.txt)" = "$(printf "big.bin\\nsub/huge.txt")"',
        [
            "cd /app/data && find . -type f -size +1000c | sed 's|^\\./||' | sort > /app/large.txt",
            "cat /app/large.txt",
        ],
        files={
            "data/small.txt": "x" * 10,
            "data/big.bin": "y" * 5000,
            "data/sub/huge.txt": "z" * 2000,
            "data/sub/tiny": "t",
        },
    ),
    _task(
        "fix-permissions",
        "files",
        "Make /app/bin/run.sh executable (by everyone), and make /app/secret.txt readable and writable by its "
        "owner only (mode 600).",
        """test -x bin/run.sh
test "$(stat -c %a secret.txt)" = 600
test "$(stat -c %a bin/run.sh)" = 755
""",
        [
            "chmod 755 /app/bin/run.sh && chmod 600 /app/secret.txt",
            "stat -c '%a %n' /app/bin/run.sh /app/secret.txt",
        ],
        files={"bin/run.sh": "#!/bin/sh\necho run\n", "secret.txt": "hunter2\n"},
        setup="chmod 644 bin/run.sh secret.txt",
    ),
    _task(
        "current-symlink",
        "files",
        "/app/releases holds v1 and v2. Make /app/current a symbolic link to /app/releases/v2.",
        'test -L current && test "$(readlink -f current)" = /app/releases/v2',
        ["ln -sfn /app/releases/v2 /app/current", "ls -l /app/current | sed 's/.*current/current/'"],
        files={"releases/v1/VERSION": "1\n", "releases/v2/VERSION": "2\n"},
    ),
    _task(
        "archive-docs",
        "files",
        "Pack the folder /app/docs (the folder itself, so paths start with docs/) into the gzip-compressed "
        "tar archive /app/backup.tar.gz.",
        """tar -tzf backup.tar.gz | grep -qx 'docs/a.md'
tar -tzf backup.tar.gz | grep -qx 'docs/deep/b.md'
""",
        ["cd /app && tar -czf backup.tar.gz docs", "tar -tzf /app/backup.tar.gz | sort"],
        files={"docs/a.md": "# a\n", "docs/deep/b.md": "# b\n"},
    ),
    _task(
        "remove-duplicates",
        "files",
        "Some files in /app/photos have the same content. Delete the duplicates, keeping of each group of "
        "identical files only the one whose name sorts first.",
        'test "$(ls photos | tr "\\n" " ")" = "a.jpg b.jpg d.jpg "',
        [
            "cd /app/photos && md5sum * | sort -k2 | awk 'seen[$1]++ {print $2}' | xargs -r rm --",
            "ls /app/photos",
        ],
        files={
            "photos/a.jpg": "cat\n",
            "photos/b.jpg": "dog\n",
            "photos/c.jpg": "cat\n",
            "photos/d.jpg": "owl\n",
            "photos/e.jpg": "dog\n",
        },
    ),
    # ----- text -----------------------------------------------------------------------------------------
    _task(
        "count-errors",
        "text",
        "Count the lines of /app/server.log that contain ERROR and write the number (only the number) to "
        "/app/errors.txt.",
        f'test "$(cat errors.txt | tr -d "[:space:]")" = "{sum("ERROR" in line for line in LOG.splitlines())}"',
        ["grep -c ERROR /app/server.log > /app/errors.txt", "cat /app/errors.txt"],
        files={"server.log": LOG + "\n"},
    ),
    _task(
        "csv-total",
        "text",
        "/app/sales.csv has a header line and the columns name,city,amount. Write the sum of the amount column "
        "for the city paris to /app/total.txt (only the number).",
        'test "$(tr -d "[:space:]" < total.txt)" = 19',
        [
            "awk -F, 'NR > 1 && $2 == \"paris\" {s += $3} END {print s}' /app/sales.csv > /app/total.txt",
            "cat /app/total.txt",
        ],
        files={"sales.csv": CSV},
    ),
    _task(
        "british-spelling",
        "text",
        "Replace every occurrence of the word colour with color (and Colour with Color) in every .md file "
        "under /app/docs; other files must not change.",
        """! grep -rq -i colour docs/*.md docs/guide/*.md
grep -q 'Color and color' docs/intro.md
grep -q colour docs/keep.txt
""",
        [
            "cd /app/docs && find . -name '*.md' -exec sed -i 's/colour/color/g; s/Colour/Color/g' {} +",
            "grep -rn -i colo /app/docs",
        ],
        files={
            "docs/intro.md": "Colour and colour.\n",
            "docs/guide/use.md": "Pick a colour.\n",
            "docs/keep.txt": "colour stays here\n",
        },
    ),
    _task(
        "top-ips",
        "text",
        "From /app/server.log, write the three client IP addresses (the last field of each line) with the most "
        "requests to /app/top3.txt, one per line, most requests first (ties: the smaller address first).",
        "test \"$(cat top3.txt)\" = \"$(awk '{print $NF}' server.log | sort | uniq -c | sort -k1,1nr -k2,2 | head -3 | awk '{print $2}')\"",
        [
            "awk '{print $NF}' /app/server.log | sort | uniq -c | sort -k1,1nr -k2,2 | head -3 | awk '{print $2}' > /app/top3.txt",
            "cat /app/top3.txt",
        ],
        files={"server.log": LOG + "\n"},
    ),
    _task(
        "active-emails",
        "text",
        "/app/users.json is a list of users. Write the emails of the active users, sorted, one per line, to "
        "/app/emails.txt.",
        'test "$(cat emails.txt)" = "$(printf "ada@x.org\\nal@x.org\\ncy@x.org")"',
        [
            "jq -r '.[] | select(.active) | .email' /app/users.json | sort > /app/emails.txt",
            "cat /app/emails.txt",
        ],
        files={"users.json": USERS},
    ),
    _task(
        "unique-words",
        "text",
        "Write every distinct word of /app/poem.txt, lower-cased, without punctuation, sorted, one per line, "
        "to /app/words.txt.",
        'test "$(cat words.txt | tr "\\n" " ")" = "a and b is rose "',
        [
            "tr 'A-Z' 'a-z' < /app/poem.txt | tr -cs 'a-z' '\\n' | sed '/^$/d' | sort -u > /app/words.txt",
            "cat /app/words.txt",
        ],
        files={"poem.txt": "A rose is a rose,\nand B is B.\n"},
    ),
    _task(
        "fix-mean",
        "text",
        "/app/stats.py should print the mean of the numbers given as arguments (python3 stats.py 1 2 6 prints "
        "3.0) but it is wrong. Fix it.",
        'test "$(python3 stats.py 1 2 6)" = 3.0\ntest "$(python3 stats.py 5)" = 5.0',
        ["sed -i 's|/ (len(nums) + 1)|/ len(nums)|' /app/stats.py", "python3 /app/stats.py 1 2 6"],
        files={
            "stats.py": "import sys\n\nnums = [float(x) for x in sys.argv[1:]]\nprint(sum(nums) / (len(nums) + 1))\n"
        },
    ),
    # ----- git ------------------------------------------------------------------------------------------
    _task(
        "first-commit",
        "git",
        "Make /app/project a git repository and commit all of its files in one commit with the message "
        "initial.",
        """cd project
test "$(git log --format=%s)" = initial
test -z "$(git status --porcelain)"
git ls-files | grep -qx src/main.py
""",
        [
            "cd /app/project && git init -q && git add -A && git commit -qm initial",
            "git -C /app/project log --stat --format=%s",
        ],
        files={"project/README.md": "# p\n", "project/src/main.py": "print('hi')\n"},
    ),
    _task(
        "merge-feature",
        "git",
        "The repository /app/repo has a branch feature. Merge it into main (a merge commit is fine) and stay "
        "on main.",
        """cd repo
test "$(git branch --show-current)" = main
git merge-base --is-ancestor feature main
test -f feature.txt && test -f base.txt
""",
        [
            "cd /app/repo && git checkout -q main && git merge -q --no-edit feature",
            "git -C /app/repo log --oneline --graph",
        ],
        setup="""git init -q repo && cd repo && echo base > base.txt && git add . && git commit -qm base
git checkout -qb feature && echo f > feature.txt && git add . && git commit -qm feature
git checkout -q main && echo more >> base.txt && git commit -qam more
""",
    ),
    _task(
        "revert-bad-commit",
        "git",
        "The last commit of /app/repo broke config.ini. Undo it with a new commit (keep the history: do not "
        "rewrite or drop commits).",
        """cd repo
test "$(git rev-list --count HEAD)" = 4
grep -qx 'port=8080' config.ini
test -z "$(git status --porcelain)"
""",
        [
            "cd /app/repo && git revert --no-edit HEAD",
            "git -C /app/repo log --oneline; cat /app/repo/config.ini",
        ],
        setup="""git init -q repo && cd repo && printf 'port=8080\\n' > config.ini && git add . && git commit -qm one
echo notes > notes.txt && git add . && git commit -qm two
printf 'port=BROKEN\\n' > config.ini && git commit -qam three
""",
    ),
    _task(
        "ignore-build-output",
        "git",
        "In the repository /app/repo, git status lists build output (the build/ folder and *.pyc files). Add "
        "a .gitignore that hides them, and commit it, so git status is clean.",
        """cd repo
test -z "$(git status --porcelain)"
git ls-files | grep -qx .gitignore
! git ls-files | grep -q build/
""",
        [
            "cd /app/repo && printf 'build/\\n*.pyc\\n' > .gitignore && git add .gitignore && git commit -qm 'ignore build output'",
            "git -C /app/repo status --short",
        ],
        setup="""git init -q repo && cd repo && echo x > app.py && git add . && git commit -qm app
mkdir build && echo bin > build/out && echo c > app.pyc
""",
    ),
    _task(
        "find-commit",
        "git",
        "One commit of /app/repo added the line SECRET=42 to settings.env. Write the subject (first line of "
        "the message) of that commit to /app/answer.txt.",
        'test "$(cat answer.txt)" = "tune settings"',
        [
            "cd /app/repo && git log -S 'SECRET=42' --format=%s -- settings.env > /app/answer.txt",
            "cat /app/answer.txt",
        ],
        setup="""git init -q repo && cd repo && echo A=1 > settings.env && git add . && git commit -qm start
echo B=2 >> settings.env && git commit -qam 'add b'
echo SECRET=42 >> settings.env && git commit -qam 'tune settings'
echo C=3 >> settings.env && git commit -qam 'add c'
""",
    ),
    # ----- builds ---------------------------------------------------------------------------------------
    _task(
        "make-build",
        "build",
        "Build the C program in /app/src with its Makefile and install the binary as /app/bin/add (running "
        "/app/bin/add 2 3 prints 5).",
        'test "$(bin/add 2 3)" = 5\ntest "$(bin/add 40 2)" = 42',
        ["cd /app/src && make", "mkdir -p /app/bin && cp /app/src/add /app/bin/add && /app/bin/add 2 3"],
        files={
            "src/add.c": "#include <stdio.h>\n#include <stdlib.h>\nint main(int c, char **v) {\n"
            '  printf("%d\\n", atoi(v[1]) + atoi(v[2]));\n  return 0;\n}\n',
            "src/Makefile": "add: add.c\n\tgcc -O2 -o add add.c\n",
        },
    ),
    _task(
        "fix-makefile",
        "build",
        "make fails in /app/hello: its Makefile was indented with spaces. Fix the Makefile so that make builds "
        "./hello, then build it.",
        'cd hello && make -s >/dev/null && test "$(./hello)" = "hello, terminal"',
        ["cd /app/hello && sed -i 's/^    /\\t/' Makefile && make", "/app/hello/hello"],
        files={
            "hello/hello.c": '#include <stdio.h>\nint main(void) { puts("hello, terminal"); return 0; }\n',
            "hello/Makefile": "hello: hello.c\n    gcc -o hello hello.c\n\nclean:\n    rm -f hello\n",
        },
    ),
    _task(
        "write-c-program",
        "build",
        "Write a C program /app/sum.c that reads whitespace-separated integers from standard input and prints "
        "their sum, and compile it to /app/sum.",
        """test "$(printf '1 2 3\\n4' | ./sum)" = 10
test "$(printf '' | ./sum)" = 0
""",
        [
            'printf \'#include <stdio.h>\\nint main(void) { long s = 0, x; while (scanf("%%ld", &x) == 1) s += x; '
            'printf("%%ld\\\\n", s); return 0; }\\n\' > /app/sum.c',
            "gcc -O2 -o /app/sum /app/sum.c && echo 1 2 3 | /app/sum",
        ],
    ),
    # ----- Python packaging -----------------------------------------------------------------------------
    _task(
        "build-wheel",
        "packaging",
        "Build a wheel of the Python package in /app/mylib into /app/dist (offline: use the installed "
        "setuptools, no build isolation).",
        """ls dist/mylib-0.1.0-py3-none-any.whl
unzip -l dist/mylib-0.1.0-py3-none-any.whl | grep -q mylib/__init__.py
""",
        [
            "cd /app/mylib && python3 -m pip wheel -q --no-build-isolation --no-deps -w /app/dist .",
            "ls /app/dist",
        ],
        files={
            "mylib/pyproject.toml": PYPROJECT.format(name="mylib", version="0.1.0"),
            "mylib/mylib/__init__.py": "def hello():\n    return 'hello'\n",
        },
    ),
    _task(
        "install-package",
        "packaging",
        "Install the package in /app/greet (offline, no build isolation) so that python3 -c 'import greet; "
        "print(greet.hi())' prints hi from any folder (for your user: you are not root).",
        f'cd / && test "$({USER_PY_C} "import greet; print(greet.hi())")" = hi',
        [
            "python3 -m pip install -q --user --no-build-isolation /app/greet",
            "cd /tmp && python3 -c 'import greet; print(greet.hi())'",
        ],
        files={
            "greet/pyproject.toml": PYPROJECT.format(name="greet", version="1.0.0"),
            "greet/greet/__init__.py": "def hi():\n    return 'hi'\n",
        },
    ),
    _task(
        "console-script",
        "packaging",
        "Give the package in /app/tool a console script: after installing it, the command tool-cli must print "
        "ok (it calls tool.cli:main). Add the entry point to pyproject.toml and install it for your user "
        "(offline, no build isolation).",
        f"""grep -q tool-cli tool/pyproject.toml
test "$(cd / && {USER_PY} /home/agent/.local/bin/tool-cli)" = ok
""",
        [
            "printf '\\n[project.scripts]\\ntool-cli = \"tool.cli:main\"\\n' >> /app/tool/pyproject.toml",
            "python3 -m pip install -q --user --no-build-isolation /app/tool && tool-cli",
        ],
        files={
            "tool/pyproject.toml": PYPROJECT.format(name="tool", version="0.2.0"),
            "tool/tool/__init__.py": "",
            "tool/tool/cli.py": "def main():\n    print('ok')\n",
        },
    ),
    _task(
        "bump-version",
        "packaging",
        "Release version 1.3.0 of /app/pkg: set the version in pyproject.toml and in pkg/__init__.py "
        "(__version__) to 1.3.0.",
        """grep -qx 'version = "1.3.0"' pkg/pyproject.toml
cd pkg && test "$(python3 -c 'import pkg; print(pkg.__version__)')" = 1.3.0
""",
        [
            "cd /app/pkg && sed -i 's/^version = .*/version = \"1.3.0\"/' pyproject.toml && "
            "sed -i 's/^__version__ = .*/__version__ = \"1.3.0\"/' pkg/__init__.py",
            "grep -rn 1.3.0 /app/pkg",
        ],
        files={
            "pkg/pyproject.toml": PYPROJECT.format(name="pkg", version="1.2.9"),
            "pkg/pkg/__init__.py": '__version__ = "1.2.9"\n',
        },
    ),
    _task(
        "run-pytest",
        "packaging",
        "The tests in /app/calc/tests fail. Fix the bug in /app/calc/calc.py (not the tests) so that "
        "python3 -m pytest passes in /app/calc.",
        # the verifier's own copy of the tests and config (not the agent's tests/, conftest.py or ini files);
        # -P: no pytest.py of the agent's in the working folder shadows the real one
        "cd calc && python3 -P -m pytest -q -p no:cacheprovider --noconftest -c /tests/pytest.ini "
        "--rootdir=/tests /tests/test_calc.py >/dev/null",
        [
            "sed -i 's/return a - b  # add/return a + b  # add/' /app/calc/calc.py",
            "cd /app/calc && python3 -m pytest -q -p no:cacheprovider > /dev/null && echo tests pass",
        ],
        files={
            "calc/calc.py": "def add(a, b):\n    return a - b  # add\n\n\ndef mul(a, b):\n    return a * b\n",
            "calc/tests/test_calc.py": "from calc import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
            "def test_mul():\n    assert mul(2, 3) == 6\n",
            "calc/conftest.py": "",
        },
        extra_tests={
            "pytest.ini": "[pytest]\n",
            "test_calc.py": "import sys\n\nsys.path.insert(0, '/app/calc')\n\nfrom calc import add, mul  # noqa: E402\n\n\n"
            "def test_add():\n    assert add(2, 3) == 5\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n",
        },
    ),
]

BY_NAME = {t.name: t for t in TASKS}
CATEGORIES = tuple(sorted({t.category for t in TASKS}))
