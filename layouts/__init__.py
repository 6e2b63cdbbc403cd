"""Pure layout functions (scale-factor atoms, swizzles, TMEM column maps), provable on the host.

Imported as ``tk_cute.layouts``; imports no kernel."""
