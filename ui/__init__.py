"""The Gradio GUI (tabs Setup, Train, Hardware, Logs, Output). Only this package and app.py
import gradio; the GUI itself lands with the GUI issue."""
