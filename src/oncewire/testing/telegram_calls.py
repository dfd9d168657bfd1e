"""The fake Telegram Bot API's side of a call: parameters read as Telegram reads them (JSON, form
or query; an object as JSON text) and errors worded as it words them.

Shared by the fake's methods (:mod:`oncewire.testing.telegram_api`) and its update methods
(:mod:`oncewire.testing.telegram_api_updates`), below both, so neither imports the other for them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["ApiError", "Reply", "bad", "int_param", "json_param", "truthy"]

Reply = tuple[int, Any]  # (HTTP status, body); body None: no answer at all


class ApiError(Exception):
    """A Bot API error answer."""

    def __init__(self, status: int, description: str, **parameters: Any) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.parameters = parameters

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "ok": False,
            "error_code": self.status,
            "description": self.description,
        }
        if self.parameters:
            body["parameters"] = self.parameters
        return body


def bad(description: str) -> ApiError:
    return ApiError(400, f"Bad Request: {description}")


def int_param(params: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = params.get(key)
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        raise bad(f"{key} must be an integer")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise bad(f"{key} must be an integer") from None


def json_param(params: Mapping[str, Any], key: str) -> Any:
    value = params.get(key)
    if isinstance(value, str):  # form and query parameters carry objects as JSON text
        try:
            return json.loads(value)
        except ValueError:
            raise bad(f"can't parse {key} JSON object") from None
    return value


def truthy(value: Any) -> bool:
    return value is True or value in ("true", "True", "1")
