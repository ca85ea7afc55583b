"""Defines no model at all."""


def helper(x):
    return x + 1
