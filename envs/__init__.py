"""Environments: gymnasium envs composed of a harness (tools, parser, prompt, budget) and a verifier."""

from sleuth.envs.base import TextSpace, ToolEnv
from sleuth.envs.code import CodeEnv
from sleuth.envs.docread import DocReadEnv
from sleuth.envs.harness import Harness
from sleuth.envs.parsers import JSONParser, ParseResult, TextParser, ToolCall, get_parser
from sleuth.envs.qa import QAEnv
from sleuth.envs.registry import make, register, registered
from sleuth.envs.tools import Tool, ToolError, ToolResult, make_tool, tool
from sleuth.verifiers.extract import extract_code

__all__ = [
    "ToolEnv", "QAEnv", "TextSpace", "DocReadEnv", "CodeEnv", "extract_code", "Harness", "JSONParser", "TextParser",
    "ToolCall", "ParseResult",
    "get_parser", "make", "register", "registered", "Tool", "ToolError", "ToolResult", "make_tool", "tool",
]
