"""What people read about incidents: the live table (`sentinel incidents`), the incident pages
(`sentinel report`) and the replay of labelled runs with its report (`sentinel evaluate`)."""
