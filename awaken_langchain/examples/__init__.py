"""Example applications that ship with the package."""
