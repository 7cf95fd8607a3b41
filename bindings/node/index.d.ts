/** The extension's path without its suffix, as loadExtension and `.load` take it. */
export declare function getLoadablePath(): string;

/** Anything with loadExtension(path): better-sqlite3's Database, node:sqlite's DatabaseSync. */
export interface LoadsExtensions {
  loadExtension(path: string): unknown;
}

/** Loads the extension into `db`. */
export declare function load(db: LoadsExtensions): void;
