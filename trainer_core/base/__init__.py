"""The bottom layer: errors, atomic writes, locks, settings, events, machine readings. Imports
nothing else of trainer_core."""
