#!/bin/bash
mv /app/notes/draft.md /app/notes/final.md
