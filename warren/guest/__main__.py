"""``python -m warren.guest``: run the guest agent."""

from .main import main

main()
