"""One module per command group; each keeps heavy imports inside its command bodies."""
