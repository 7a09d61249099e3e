"""The app's screens: the chat, help, sessions browser, replay, load error, system prompt."""

from dflash_tui.tui.screens.chat import ChatScreen
from dflash_tui.tui.screens.error import LoadErrorScreen
from dflash_tui.tui.screens.help import HelpScreen
from dflash_tui.tui.screens.replay import ReplayScreen
from dflash_tui.tui.screens.sessions import SessionsScreen
from dflash_tui.tui.screens.system_prompt import SystemPromptScreen

__all__ = ["ChatScreen", "HelpScreen", "LoadErrorScreen", "ReplayScreen", "SessionsScreen", "SystemPromptScreen"]
