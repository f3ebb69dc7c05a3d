"""slime's dynamic sampling filters, under slime's module path (`slime.` -> `slimeish.`)."""
