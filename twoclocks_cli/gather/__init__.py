"""What each command collects from the store and the clocks before it is rendered (renderers
receive this data and never read the store)."""
