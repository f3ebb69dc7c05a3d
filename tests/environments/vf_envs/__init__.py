"""verifiers environments written with verifiers' public API (`import verifiers as vf`), loaded by
`vf.load_environment` through their module path, as an installed environment package is."""
