"""Protection: the penalty box (ban rules, the bans they imposed) and the allow and deny lists,
in a section of their own."""
