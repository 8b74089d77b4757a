"""What the converter commands share: flags, input reading, progress."""
