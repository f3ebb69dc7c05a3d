"""slime's plugin helpers under slime's module paths (`slime.utils.X` -> `slimeish.utils.X`)."""
