"""The app's screens: the chat, help, sessions browser, replay, load error, Markdown view, system prompt."""

from .chat import ChatScreen
from .error import LoadErrorScreen
from .help import HelpScreen
from .markdown import MarkdownScreen
from .replay import ReplayScreen
from .sessions import SessionsScreen
from .system_prompt import SystemPromptScreen

__all__ = ["ChatScreen", "HelpScreen", "LoadErrorScreen", "MarkdownScreen", "ReplayScreen", "SessionsScreen",
           "SystemPromptScreen"]
