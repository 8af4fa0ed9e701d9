"""The live panel (``nbcoord.panel()``): widget, state shaping, sender, commands, acknowledgements, actions."""
