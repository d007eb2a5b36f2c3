"""Prompt text kept in files: a system prompt, and a template that wraps each plain-text prompt.

`prompt_texts` reads both from the `data` section: the pre-flight (trainer/preflight.py `load_data`) before a run
starts, to check them, and the single-turn rollouts (trainer/run_inputs.py), which send [system, user:
template.format(prompt)] for rows with a plain-text prompt (chat-message rows are used as given).
A template holds exactly one `{}` where the prompt goes; literal braces are written `{{` and `}}`, as in Python
format strings (so NeMo-RL's prompt files, such as `\\boxed{{}}` instructions, are read the same way).
"""

import string
from dataclasses import dataclass
from pathlib import Path

from asyncppo.config import ConfigError
from asyncppo.config.data import DataConfig


@dataclass(frozen=True)
class PromptTexts:
    """What single-turn rollouts wrap a plain-text prompt in."""

    system_prompt: str | None
    """data.system_prompt, or data.system_prompt_file's content; None = no system message."""
    prompt_template: str | None
    """data.prompt_file's template (one `{}`); None = the prompt as is."""


def prompt_texts(data: DataConfig, gym: bool) -> PromptTexts:
    """The system prompt and prompt template of data.system_prompt(_file) and data.prompt_file. A file that cannot
    be read, a template without exactly one `{}`, or either file in a gym run (`gym`: gym rows carry their own
    input) is a ConfigError naming its key."""
    files = {"data.system_prompt_file": data.system_prompt_file, "data.prompt_file": data.prompt_file}
    texts: dict[str, str | None] = dict.fromkeys(files)
    for key, path in files.items():
        if path is None:
            continue
        if gym:
            raise ConfigError([f"{key}: gym rows carry their own input, so {key} does not apply; remove it"])
        try:
            texts[key] = read_prompt_template(path) if key == "data.prompt_file" else read_text(path)
        except ValueError as error:
            raise ConfigError([f"{key}: {error}"]) from None
    system_prompt = data.system_prompt if data.system_prompt is not None else texts["data.system_prompt_file"]
    return PromptTexts(system_prompt, texts["data.prompt_file"])


def read_text(path: str | Path) -> str:
    """The whole content of the UTF-8 text file `path` (relative paths: from the working directory); ValueError
    naming the path when it is missing, unreadable or not UTF-8 text."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{str(path)!r} does not exist (relative paths resolve from {Path.cwd()})") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{str(path)!r} is not UTF-8 text ({error.reason})") from None
    except OSError as error:
        raise ValueError(f"{str(path)!r} cannot be read ({error.strerror or error})") from None


def read_prompt_template(path: str | Path) -> str:
    """The template in `path`; ValueError naming the file unless it holds exactly one `{}` and no other field."""
    template = read_text(path)
    literal_braces = "write literal braces as {{ and }}"
    try:
        fields = [parsed[1:] for parsed in string.Formatter().parse(template) if parsed[1] is not None]
    except ValueError as error:
        raise ValueError(f"{str(path)!r} is not a prompt template ({error}); {literal_braces}") from None
    if fields != [("", "", None)]:
        found = [
            f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}"
            for name, spec, conversion in fields
        ]
        raise ValueError(
            f"{str(path)!r} must hold exactly one {{}} where the prompt goes and no other field; it holds "
            f"{len(fields)}: {found}; {literal_braces}"
        )
    return template


def fill_prompt_template(template: str, prompt: str) -> str:
    """`template` with its `{}` replaced by `prompt` (a template checked by `read_prompt_template`)."""
    return template.format(prompt)
