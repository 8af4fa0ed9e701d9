"""The live panel: widget, state shaping, sender, commands, acknowledgements, actions."""
