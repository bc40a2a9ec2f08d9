"""One loader per framework config format; detect.py picks one from the file."""
