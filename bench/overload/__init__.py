"""`bench overload`: open-loop Poisson load at multiples of the knee, with bursting on and off, and its report."""
