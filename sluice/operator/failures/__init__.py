"""What the operator does when records fail: containment of a failing batch, bisection to the poisoned
record, the out-of-memory governor that shrinks batches, and dead-letter records with their reasons.
"""
