"""Reference measurements shipped as data, and the comparisons of ``whichgpu validate``."""
